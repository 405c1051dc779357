/* torch_object: a torch.save'd object re-wrapped between two forms.
 *
 * Megatron stores a ShardedObject as a torch.save of the object in the
 * zarr backend (`<key>/shard_<...>.pt`), but as a torch.save of a
 * one-element list [object] in torch_dist.  A view of the other backend
 * must re-wrap it: rs_torch_object_append writes the object's torch.save
 * zip with data.pkl wrapped into (or unwrapped from) that list, and every
 * other record served from the source as it is (CRCs from the source's
 * central directory, so the zip checks out).
 *
 * Unwrapping needs data.pkl to be Python's pickle of a one-element list
 * (PROTO 2, EMPTY_LIST, BINPUT 0, the object, APPEND, STOP) - which
 * torch.save writes.  Anything else is refused with -EINVAL and a reason,
 * never passed through in the wrong form.
 */
#ifndef RS_TORCH_OBJECT_H
#define RS_TORCH_OBJECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "planner/source.h"
#include "planner/vtree.h"

/* Room for a refusal's reason. */
#define RS_TORCH_OBJECT_WHY_SIZE 200

/* A torch.save zip stored at bytes [offset, offset+length) of `source`. */
typedef struct {
	uint32_t source;
	uint64_t offset, length;
	bool listed;            /* it saves [object], not the object */
} rs_torch_object;

/* Appends o to `file` of t in the form asked for (`as_list`), converting
 * when o->listed differs.  *length receives the bytes added.  -EINVAL
 * with the reason in why[0, why_size) when o is not a torch.save zip of
 * the form the conversion needs; -ENOMEM. */
int rs_torch_object_append(rs_sources *src, const rs_torch_object *o,
			   bool as_list, rs_vtree *t, uint32_t file,
			   uint64_t *length, char *why, size_t why_size);

/* A whole torch.save file of the pickle pkl[0, len) (an object holding
 * no tensor), as torch 2.x writes it, into a malloc'd *out of *out_len
 * bytes: what a view shows for an object no source stores (a None
 * _extra_state, an empty common state).  0, -ENOMEM, or the layout's
 * error. */
int rs_torch_object_make(const void *pkl, size_t len, uint8_t **out,
			 size_t *out_len);

#endif
