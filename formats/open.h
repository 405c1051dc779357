/* open: the format table - opening a SOURCE in whichever format it is,
 * and building any view of it.
 *
 * formats/open.c lists every format (one rs_format_def row each, defined
 * in that format's folder) and is the only place that knows the list.
 * Detection, in order:
 *   1. a metadata.json at the top names a Megatron dist checkpoint's
 *      backend: the row whose dist_backend it is (another is refused);
 *   2. else a top-level name one row's detector calls a marker decides;
 *   3. else the rows whose files' names are at the top: exactly one.
 * Errors as formats/checkpoint.h: one line each, then -EINVAL.
 */
#ifndef RS_OPEN_H
#define RS_OPEN_H

#include "formats/checkpoint.h"

/* Detects the format of SOURCE `root` and reads it into ck (metadata
 * only).  On error ck is closed. */
int rs_checkpoint_open(const char *root, const rs_open_opts *o,
		       rs_checkpoint *ck, rs_diag *d);

/* Builds the view in format `view` (NULL: the source's default view,
 * rs_format_default_view) into t, which this initialises. */
int rs_checkpoint_build_view(const rs_checkpoint *ck,
			     const rs_format_def *view, const rs_layout *l,
			     rs_vtree *t, rs_diag *d);

/* The format a view can be shown in, by the name -o format= takes; NULL
 * when no format of that name has a view. */
const rs_format_def *rs_format_find_view(const char *name);

/* The names -o format= takes, as "a, b or c", into out. */
void rs_format_view_names(char *out, size_t size);

/* The view a source is shown as without -o format=: its own format, or
 * what its row names (safetensors for metaseq shards). */
const rs_format_def *rs_format_default_view(const rs_format_def *source);

#endif
