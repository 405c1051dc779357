#include "planner/dtype.h"

#include <string.h>

static const struct {
	rs_dtype type;
	unsigned size;
	const char *zarr;
	const char *name;
} dtypes[] = {
	{ RS_DTYPE_BOOL, 1, "|b1", "bool" },
	{ RS_DTYPE_U8, 1, "|u1", "uint8" },
	{ RS_DTYPE_I8, 1, "|i1", "int8" },
	{ RS_DTYPE_I16, 2, "<i2", "int16" },
	{ RS_DTYPE_I32, 4, "<i4", "int32" },
	{ RS_DTYPE_I64, 8, "<i8", "int64" },
	{ RS_DTYPE_F16, 2, "<f2", "float16" },
	{ RS_DTYPE_BF16, 2, "bfloat16", "bfloat16" },
	{ RS_DTYPE_F32, 4, "<f4", "float32" },
	{ RS_DTYPE_F64, 8, "<f8", "float64" },
};
#define N_DTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

unsigned rs_dtype_size(rs_dtype t)
{
	for (size_t i = 0; i < N_DTYPES; i++)
		if (dtypes[i].type == t)
			return dtypes[i].size;
	return 0;
}

rs_dtype rs_dtype_from_zarr(const char *s)
{
	if (!s)
		return RS_DTYPE_INVALID;
	for (size_t i = 0; i < N_DTYPES; i++)
		if (strcmp(dtypes[i].zarr, s) == 0)
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
	for (size_t i = 0; i < N_DTYPES; i++)
		if (dtypes[i].type == t)
			return dtypes[i].zarr;
	return NULL;
}

const char *rs_dtype_name(rs_dtype t)
{
	for (size_t i = 0; i < N_DTYPES; i++)
		if (dtypes[i].type == t)
			return dtypes[i].name;
	return "invalid";
}
