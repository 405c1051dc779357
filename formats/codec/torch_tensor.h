/* torch_tensor: a tensor inside a torch.save data.pkl
 * (docs/FORMATS.md, "torch.save").
 *
 * torch.save pickles a tensor as _rebuild_tensor_v2(storage, offset, size,
 * stride, ...) over a typed storage (FloatStorage, ...), or, for dtypes
 * without one (fp8), _rebuild_tensor_v3(..., dtype) over an UntypedStorage
 * that counts bytes; torch before 1.0 wrote _rebuild_tensor(storage,
 * offset, size, stride).  An nn.Parameter wraps one in _rebuild_parameter
 * or _rebuild_parameter_with_state; a tensor with Python attributes in
 * torch._tensor._rebuild_from_type_v2(func, torch.Tensor, args, state)
 * (both read as the tensor inside).  The storage is a persistent id
 * ('storage', class, key, location, numel) whose bytes are the zip record
 * data/<key>.
 *
 * rs_torch_tensor_read checks everything against the zip: the storage
 * record exists, holds numel elements, and every element the sizes and
 * strides reach lies inside it (an empty tensor reaches none, and its
 * storage may be empty), and the strides reach at least as many elements
 * as the tensor has (no 0 stride: an expanded view would make a small file
 * show a huge one).  Sizes are overflow-checked.  Returns 0, or -EINVAL
 * with a phrase in why for the caller's line ("<file>: <name> <why>"):
 * "is not one torch tensor", "has a dtype reshardfs does not know", "has
 * elements outside their storage", "repeats stored elements ...", "is a
 * tensor subclass (<class>), which reshardfs does not read", or, for
 * every other rebuild function (quantized, sparse, meta, nested,
 * wrapper-subclass, device tensors), "is a tensor rebuilt by
 * torch._utils.<function>, which reshardfs does not read (only dense
 * tensors over a storage)".
 */
#ifndef RS_TORCH_TENSOR_H
#define RS_TORCH_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/codec/pickle.h"
#include "formats/codec/torchzip.h"
#include "planner/box.h"
#include "planner/dtype.h"

typedef struct {
	rs_dtype dtype;
	int ndim;
	uint64_t shape[RS_MAX_DIMS];
	uint64_t stride[RS_MAX_DIMS];  /* elements */
	uint64_t offset;   /* of the first element, from the zip's first byte
			    * (the storage record's start when empty) */
	bool empty;        /* some extent is 0 */
} rs_torch_tensor;

/* A torch.<name> global as a dtype: torch.float32 and the like, or with
 * `storage` a typed storage class (torch.FloatStorage); INVALID else. */
rs_dtype rs_torch_dtype(const rs_pvalue *g, bool storage);

/* A call of any of torch's tensor rebuild functions (torch._utils's
 * _rebuild_*, torch._tensor._rebuild_from_type_v2), read or not: what a
 * model walk takes for a tensor rather than a container. */
bool rs_torch_is_tensor(const rs_pvalue *v);

int rs_torch_tensor_read(const rs_zip *z, const rs_pvalue *v,
			 rs_torch_tensor *t, char *why, size_t whylen);

/* Writes, as torch.save does, a dense C-order tensor of `shape` over the
 * storage data/<key> (the caller writes that record): _rebuild_tensor_v2
 * over the dtype's typed storage, or for a dtype without one (fp8)
 * _rebuild_tensor_v3 over an UntypedStorage counted in bytes, with the
 * dtype last.  The shape's element count must not overflow (the caller
 * sized the record). */
void rs_pw_torch_tensor(rs_pwriter *w, rs_dtype dtype, const uint64_t *shape,
			int ndim, const char *key);

#endif
