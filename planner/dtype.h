/* dtype: element types a checkpoint can hold.
 *
 * Only the size matters to resharding (bytes are moved, not interpreted);
 * names are kept so views can write them back in each format's spelling.
 */
#ifndef RS_DTYPE_H
#define RS_DTYPE_H

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
} rs_dtype;

/* Bytes per element; 0 for RS_DTYPE_INVALID. */
unsigned rs_dtype_size(rs_dtype t);

/* zarr v2 spelling ("<f4", "bfloat16", ...).  Big-endian and unknown
 * spellings give RS_DTYPE_INVALID. */
rs_dtype rs_dtype_from_zarr(const char *s);
const char *rs_dtype_name(rs_dtype t);
/* The zarr v2 spelling of t ("<f4", "bfloat16"), or NULL. */
const char *rs_dtype_zarr_name(rs_dtype t);

#endif
