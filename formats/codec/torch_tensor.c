#include "formats/codec/torch_tensor.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

rs_dtype rs_torch_dtype(const rs_pvalue *g, bool storage)
{
	const char *mod = rs_pv_global_module(g), *name = rs_pv_global_name(g);

	if (!mod || !name || strcmp(mod, "torch") != 0)
		return RS_DTYPE_INVALID;
	return rs_dtype_from_torch(name, storage);
}

/* A REDUCE of a function torch.save names for a tensor: torch._utils's
 * _rebuild_* (dense, parameter, quantized, sparse, meta, nested, ...) or
 * torch._tensor._rebuild_from_type_v2. */
bool rs_torch_is_tensor(const rs_pvalue *v)
{
	const rs_pvalue *f = rs_pv_func(v);
	const char *mod = rs_pv_global_module(f), *name = rs_pv_global_name(f);

	if (rs_pv_kind(v) != RS_PV_REDUCE || !mod || rs_pv_global_attr(f))
		return false;
	return (strcmp(mod, "torch._utils") == 0 &&
		strncmp(name, "_rebuild_", 9) == 0) ||
	       rs_pv_global_is(f, "torch._tensor._rebuild_from_type_v2");
}

/* The dense rebuild `func` (a GLOBAL) over `args`: _rebuild_tensor
 * (torch before 1.0: storage, offset, size, stride), _rebuild_tensor_v2
 * (... requires_grad, hooks[, metadata]) over a typed storage, or
 * _rebuild_tensor_v3 (... hooks, dtype[, metadata]) over an
 * UntypedStorage.  0, or 1 when func is none of them. */
static int read_dense(const rs_zip *z, const rs_pvalue *func,
		      const rs_pvalue *args, rs_torch_tensor *t,
		      const char **why)
{
	const rs_pvalue *pid, *storage;
	const rs_zip_entry *data;
	uint64_t soff, numel, bytes, last, esize;
	const char *key;
	size_t klen;
	char record[64];
	int n2 = 0;
	bool v3, untyped;

	v3 = rs_pv_global_is(func, "torch._utils._rebuild_tensor_v3");
	if (!v3 && !rs_pv_global_is(func, "torch._utils._rebuild_tensor_v2") &&
	    !rs_pv_global_is(func, "torch._utils._rebuild_tensor"))
		return 1;
	pid = rs_pv_persid(rs_pv_item(args, 0));
	storage = rs_pv_item(pid, 1);
	key = rs_pv_str(rs_pv_item(pid, 2), &klen);
	if (key && strlen(key) != klen)
		key = NULL;     /* a NUL inside would name another record */
	*why = "is not one torch tensor";
	if (!rs_pv_str_is(rs_pv_item(pid, 0), "storage") || !key ||
	    strlen(key) > 40 || !rs_pv_u64(rs_pv_item(pid, 4), &numel) ||
	    !rs_pv_u64(rs_pv_item(args, 1), &soff) ||
	    !rs_pv_dims(rs_pv_item(args, 2), t->shape, &t->ndim, RS_MAX_DIMS) ||
	    !rs_pv_dims(rs_pv_item(args, 3), t->stride, &n2, RS_MAX_DIMS) ||
	    n2 != t->ndim)
		return -EINVAL;
	untyped = rs_pv_global_is(storage, "torch.UntypedStorage") ||
		  rs_pv_global_is(storage, "torch.storage.UntypedStorage");
	t->dtype = v3 ? rs_torch_dtype(rs_pv_item(args, 6), false)
		      : rs_torch_dtype(storage, true);
	*why = "has a dtype reshardfs does not know";
	if (t->dtype == RS_DTYPE_INVALID || (v3 && !untyped))
		return -EINVAL;
	esize = rs_dtype_size(t->dtype);
	*why = "has elements outside their storage";
	/* An UntypedStorage counts bytes, a typed one elements. */
	if (untyped) {
		if (numel % esize)
			return -EINVAL;
		numel /= esize;
	}
	snprintf(record, sizeof(record), "data/%s", key);
	data = rs_zip_find(z, record);
	last = soff;
	for (int i = 0; i < t->ndim; i++) {
		uint64_t step;

		if (t->shape[i] == 0) {
			t->empty = true;
			break;
		}
		if (!rs_mul_u64(t->shape[i] - 1, t->stride[i], &step) ||
		    !rs_add_u64(last, step, &last))
			last = UINT64_MAX;
	}
	if (!data || !rs_mul_u64(numel, esize, &bytes) || bytes > data->size ||
	    (!t->empty && last >= numel))
		return -EINVAL;
	/* Strides that reach fewer elements than the tensor has (a 0 stride:
	 * an expanded view) repeat stored bytes: a 6 KB file could show
	 * terabytes, which a copy of the view would then read. */
	*why = "repeats stored elements (a stride of 0, or overlapping strides): an expanded view is not read";
	if (!t->empty) {
		uint64_t count;

		if (!rs_product(t->shape, t->ndim, &count) || count > last - soff + 1)
			return -EINVAL;
	}
	t->offset = data->offset + (t->empty ? 0 : soff * esize);
	*why = NULL;
	return 0;
}

int rs_torch_tensor_read(const rs_zip *z, const rs_pvalue *v,
			 rs_torch_tensor *t, char *why, size_t whylen)
{
	const rs_pvalue *func = rs_pv_func(v), *args = rs_pv_args(v);
	const char *phrase = "is not one torch tensor";
	int err;

	memset(t, 0, sizeof(*t));
	if (rs_pv_kind(v) != RS_PV_REDUCE)
		goto refuse;
	/* nn.Parameter: _rebuild_parameter(tensor, requires_grad, hooks),
	 * _with_state adding the Parameter's __dict__ and slots. */
	if (rs_pv_global_is(func, "torch._utils._rebuild_parameter") ||
	    rs_pv_global_is(func, "torch._utils._rebuild_parameter_with_state")) {
		v = rs_pv_item(args, 0);
		if (rs_pv_kind(v) != RS_PV_REDUCE)
			goto refuse;
		func = rs_pv_func(v);
		args = rs_pv_args(v);
	}
	/* A tensor with Python attributes, or of a subclass:
	 * _rebuild_from_type_v2(func, type, args, state).  Read when the
	 * type is Tensor itself (the attributes are not data); a subclass
	 * may mean anything by its storage. */
	if (rs_pv_global_is(func, "torch._tensor._rebuild_from_type_v2")) {
		const rs_pvalue *type = rs_pv_item(args, 1);

		if (!rs_pv_global_is(type, "torch.Tensor") &&
		    !rs_pv_global_is(type, "torch._tensor.Tensor")) {
			snprintf(why, whylen, "is a tensor subclass (%s.%s), which reshardfs does not read",
				 rs_pv_global_module(type) ? rs_pv_global_module(type) : "?",
				 rs_pv_global_name(type) ? rs_pv_global_name(type) : "?");
			return -EINVAL;
		}
		func = rs_pv_item(args, 0);
		args = rs_pv_item(args, 2);
	}
	err = read_dense(z, func, args, t, &phrase);
	if (err <= 0) {
		if (err)
			snprintf(why, whylen, "%s", phrase);
		return err;
	}
	/* Quantized, sparse, meta, nested, wrapper-subclass and device
	 * tensors: no dense storage of one dtype to serve. */
	if (rs_pv_global_module(func) && rs_pv_global_name(func) &&
	    (rs_pv_global_is(func, "torch._tensor._rebuild_from_type_v2") ||
	     (strcmp(rs_pv_global_module(func), "torch._utils") == 0 &&
	      strncmp(rs_pv_global_name(func), "_rebuild_", 9) == 0))) {
		snprintf(why, whylen, "is a tensor rebuilt by %s.%s, which reshardfs does not read (only dense tensors over a storage)",
			 rs_pv_global_module(func), rs_pv_global_name(func));
		return -EINVAL;
	}
refuse:
	snprintf(why, whylen, "%s", phrase);
	return -EINVAL;
}

void rs_pw_torch_tensor(rs_pwriter *w, rs_dtype dtype, const uint64_t *shape,
			int ndim, const char *key)
{
	const char *storage = rs_dtype_torch_storage(dtype);
	uint64_t stride[RS_MAX_DIMS], numel = 1;

	rs_c_strides(shape, ndim, stride);
	for (int i = 0; i < ndim; i++)
		numel *= shape[i];
	rs_pw_global(w, "torch._utils",
		     storage ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
	rs_pw_tuple_begin(w);
	/* the storage, by persistent id */
	rs_pw_tuple_begin(w);
	rs_pw_cstr(w, "storage");
	if (storage)
		rs_pw_global(w, "torch", storage);
	else
		rs_pw_global(w, "torch.storage", "UntypedStorage");
	rs_pw_cstr(w, key);
	rs_pw_cstr(w, "cpu");
	rs_pw_int(w, (int64_t)(storage ? numel : numel * rs_dtype_size(dtype)));
	rs_pw_tuple_end(w);
	rs_pw_persid(w);
	rs_pw_int(w, 0);
	rs_pw_tuple_begin(w);
	for (int i = 0; i < ndim; i++)
		rs_pw_int(w, (int64_t)shape[i]);
	rs_pw_tuple_end(w);
	rs_pw_tuple_begin(w);
	for (int i = 0; i < ndim; i++)
		rs_pw_int(w, (int64_t)stride[i]);
	rs_pw_tuple_end(w);
	rs_pw_bool(w, false);
	rs_pw_global(w, "collections", "OrderedDict");
	rs_pw_tuple_n(w, 0);
	rs_pw_reduce(w);
	if (!storage)
		rs_pw_global(w, "torch", rs_dtype_torch_name(dtype));
	rs_pw_tuple_end(w);
	rs_pw_reduce(w);
}
