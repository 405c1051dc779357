/* dtype: element types a checkpoint can hold.
 *
 * Resharding moves bytes without interpreting them, so mostly only the size
 * matters; names are kept so views can write them back in each format's
 * spelling.  A view with `-o dtype=` converts the floating-point types
 * (gpu/cast.h does the arithmetic).
 */
#ifndef RS_DTYPE_H
#define RS_DTYPE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
	RS_DTYPE_INVALID = 0,
	RS_DTYPE_BOOL,
	RS_DTYPE_U8,
	RS_DTYPE_I8,
	RS_DTYPE_I16,
	RS_DTYPE_I32,
	RS_DTYPE_I64,
	RS_DTYPE_F16,
	RS_DTYPE_BF16,
	RS_DTYPE_F32,
	RS_DTYPE_F64,
	RS_DTYPE_F8E4M3,        /* torch.float8_e4m3fn: no Inf, max 448 */
	RS_DTYPE_F8E5M2,        /* torch.float8_e5m2 */
} rs_dtype;

/* Bytes per element; 0 for RS_DTYPE_INVALID. */
unsigned rs_dtype_size(rs_dtype t);

/* True for the floating-point types (the ones a dtype view converts). */
bool rs_dtype_is_float(rs_dtype t);

/* zarr v2 spelling ("<f4", "bfloat16", ...).  Big-endian, unknown and
 * fp8 spellings (zarr v2 has none) give RS_DTYPE_INVALID. */
rs_dtype rs_dtype_from_zarr(const char *s);
/* The zarr v2 spelling of t ("<f4", "bfloat16"), or NULL (fp8). */
const char *rs_dtype_zarr_name(rs_dtype t);

/* torch's name ("float32": the global torch.float32) and legacy typed
 * storage class ("FloatStorage"; NULL for fp8, which torch.save writes
 * over an UntypedStorage).  from_torch
 * matches one of the two (`storage` picks which); INVALID when unknown. */
const char *rs_dtype_torch_name(rs_dtype t);
const char *rs_dtype_torch_storage(rs_dtype t);
rs_dtype rs_dtype_from_torch(const char *name, bool storage);

/* The name used in messages and stats ("float32", "float8_e4m3fn"). */
const char *rs_dtype_name(rs_dtype t);

/* The -o dtype= spelling of a view dtype: "bf16", "f16", "f32" (also
 * "bfloat16", "float16", "float32"); INVALID for anything else. */
rs_dtype rs_dtype_from_option(const char *s);

#endif
