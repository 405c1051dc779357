#include "planner/dtype.h"

#include <stddef.h>
#include <string.h>

static const struct {
	rs_dtype type;
	unsigned size;
	bool is_float;
	const char *zarr;       /* NULL: zarr v2 has no spelling */
	const char *name;       /* torch.<name> too */
	const char *storage;    /* torch's legacy typed storage class */
} dtypes[] = {
	{ RS_DTYPE_BOOL, 1, false, "|b1", "bool", "BoolStorage" },
	{ RS_DTYPE_U8, 1, false, "|u1", "uint8", "ByteStorage" },
	{ RS_DTYPE_I8, 1, false, "|i1", "int8", "CharStorage" },
	{ RS_DTYPE_I16, 2, false, "<i2", "int16", "ShortStorage" },
	{ RS_DTYPE_I32, 4, false, "<i4", "int32", "IntStorage" },
	{ RS_DTYPE_I64, 8, false, "<i8", "int64", "LongStorage" },
	{ RS_DTYPE_F16, 2, true, "<f2", "float16", "HalfStorage" },
	{ RS_DTYPE_BF16, 2, true, "bfloat16", "bfloat16", "BFloat16Storage" },
	{ RS_DTYPE_F32, 4, true, "<f4", "float32", "FloatStorage" },
	{ RS_DTYPE_F64, 8, true, "<f8", "float64", "DoubleStorage" },
	{ RS_DTYPE_F8E4M3, 1, true, NULL, "float8_e4m3fn", NULL },
	{ RS_DTYPE_F8E5M2, 1, true, NULL, "float8_e5m2", NULL },
};
#define N_DTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

static size_t find(rs_dtype t)
{
	for (size_t i = 0; i < N_DTYPES; i++)
		if (dtypes[i].type == t)
			return i;
	return N_DTYPES;
}

unsigned rs_dtype_size(rs_dtype t)
{
	size_t i = find(t);

	return i < N_DTYPES ? dtypes[i].size : 0;
}

bool rs_dtype_is_float(rs_dtype t)
{
	size_t i = find(t);

	return i < N_DTYPES && dtypes[i].is_float;
}

rs_dtype rs_dtype_from_zarr(const char *s)
{
	if (!s)
		return RS_DTYPE_INVALID;
	for (size_t i = 0; i < N_DTYPES; i++)
		if (dtypes[i].zarr && strcmp(dtypes[i].zarr, s) == 0)
			return dtypes[i].type;
	/* Single-byte types are also written with '<' or '>' by some tools. */
	if ((s[0] == '<' || s[0] == '>') && s[1] && s[2] == '1' && !s[3]) {
		char alt[4] = { '|', s[1], '1', 0 };
		return rs_dtype_from_zarr(alt);
	}
	return RS_DTYPE_INVALID;
}

const char *rs_dtype_zarr_name(rs_dtype t)
{
	size_t i = find(t);

	return i < N_DTYPES ? dtypes[i].zarr : NULL;
}

const char *rs_dtype_torch_name(rs_dtype t)
{
	size_t i = find(t);

	return i < N_DTYPES ? dtypes[i].name : NULL;
}

const char *rs_dtype_torch_storage(rs_dtype t)
{
	size_t i = find(t);

	return i < N_DTYPES ? dtypes[i].storage : NULL;
}

rs_dtype rs_dtype_from_torch(const char *name, bool storage)
{
	if (!name)
		return RS_DTYPE_INVALID;
	for (size_t i = 0; i < N_DTYPES; i++)
		if ((storage ? dtypes[i].storage : dtypes[i].name) &&
		    strcmp(name, storage ? dtypes[i].storage : dtypes[i].name) == 0)
			return dtypes[i].type;
	return RS_DTYPE_INVALID;
}

const char *rs_dtype_name(rs_dtype t)
{
	size_t i = find(t);

	return i < N_DTYPES ? dtypes[i].name : "invalid";
}

rs_dtype rs_dtype_from_option(const char *s)
{
	static const struct {
		const char *spelling;
		rs_dtype type;
	} names[] = {
		{ "bf16", RS_DTYPE_BF16 }, { "bfloat16", RS_DTYPE_BF16 },
		{ "f16", RS_DTYPE_F16 }, { "float16", RS_DTYPE_F16 },
		{ "fp16", RS_DTYPE_F16 }, { "f32", RS_DTYPE_F32 },
		{ "float32", RS_DTYPE_F32 }, { "fp32", RS_DTYPE_F32 },
	};

	for (size_t i = 0; s && i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(s, names[i].spelling) == 0)
			return names[i].type;
	return RS_DTYPE_INVALID;
}
