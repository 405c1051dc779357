/* Re-wrapping torch.save objects (formats/codec/torch_object.h). */
#include "formats/codec/torch_object.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/codec/pickle.h"
#include "formats/codec/torchzip.h"

/* data.pkl of a ShardedObject is small; a large one is not one. */
#define RS_OBJECT_PKL_MAX (16u << 20)

/* PROTO 2 <body> STOP  ->  PROTO 2 EMPTY_LIST <body> APPEND STOP */
static uint8_t *wrap(const uint8_t *p, size_t n, size_t *out_len)
{
	uint8_t *o;

	if (n < 3 || p[0] != 0x80 || p[1] != 2 || p[n - 1] != '.')
		return NULL;
	o = malloc(n + 2);
	if (!o)
		return NULL;
	o[0] = 0x80;
	o[1] = 2;
	o[2] = ']';
	memcpy(o + 3, p + 2, n - 3);
	o[n] = 'a';
	o[n + 1] = '.';
	*out_len = n + 2;
	return o;
}

/* PROTO 2 EMPTY_LIST [BINPUT 0] <obj> APPEND STOP  ->  PROTO 2 <obj> STOP.
 * Python's pickler memoizes the list (BINPUT 0); wrap() above does not, so
 * a torch_dist view's own objects come back without it.  Either way the
 * parse proves it is one list holding one item. */
static uint8_t *unwrap(const uint8_t *p, size_t n, size_t *out_len)
{
	static const uint8_t head[] = { 0x80, 2, ']', 'q', 0 };
	rs_pickle_limits lim;
	rs_pickle *pk = NULL;
	char err[160];
	uint8_t *o = NULL;
	size_t skip;
	bool one;

	/* At least PROTO, EMPTY_LIST, one opcode, APPEND, STOP. */
	if (n < 6 || memcmp(p, head, 3) != 0 || p[n - 2] != 'a' ||
	    p[n - 1] != '.')
		return NULL;
	skip = n >= sizeof(head) + 3 && memcmp(p, head, sizeof(head)) == 0
		? sizeof(head) : 3;
	rs_pickle_limits_default(&lim);
	lim.allow = rs_pickle_allow_torch;
	lim.torch_persids = true;
	if (rs_pickle_parse(p, n, &lim, &pk, err, sizeof(err)) != 0)
		return NULL;
	one = rs_pv_kind(rs_pickle_root(pk)) == RS_PV_LIST &&
	      rs_pv_len(rs_pickle_root(pk)) == 1;
	rs_pickle_free(pk);
	if (!one || !(o = malloc(n - skip + 1)))
		return NULL;
	o[0] = 0x80;
	o[1] = 2;
	memcpy(o + 2, p + skip, n - skip - 2);
	o[n - skip] = '.';
	*out_len = n - skip + 1;
	return o;
}

int rs_torch_object_append(rs_sources *src, const rs_torch_object *o,
			   bool as_list, rs_vtree *t, uint32_t file,
			   uint64_t *length, char *why, size_t why_size)
{
	char msg[RS_ZIP_MSG_SIZE];
	rs_zip z = { 0 };
	rs_zip_layout lay = { 0 };
	rs_zip_input *in = NULL;
	uint8_t *pkl = NULL, *conv = NULL;
	size_t conv_len = 0;
	const rs_zip_entry *pe;
	int fd, err;

	if (o->listed == as_list) {
		*length = o->length;
		return rs_vtree_append_source(t, file, o->source, o->offset,
					      o->length);
	}
	err = rs_sources_fd(src, o->source, &fd);
	if (!err)
		err = rs_zip_open(&z, fd, o->offset, o->length, msg, sizeof(msg));
	if (err) {
		snprintf(why, why_size, "%s",
			 err == -EINVAL ? msg : "cannot be read");
		goto fail;
	}
	pe = rs_zip_find(&z, "data.pkl");
	if (pe && pe->size <= RS_OBJECT_PKL_MAX && (pkl = malloc(pe->size + 1)) &&
	    pread(fd, pkl, pe->size, (off_t)(o->offset + pe->offset)) ==
		    (ssize_t)pe->size)
		conv = as_list ? wrap(pkl, pe->size, &conv_len)
			       : unwrap(pkl, pe->size, &conv_len);
	if (!conv) {
		snprintf(why, why_size,
			 "data.pkl is not the torch.save %s this conversion needs",
			 as_list ? "of an object" : "of a one-item list");
		goto fail;
	}
	/* Same records, same order; only data.pkl changes. */
	in = calloc(z.count, sizeof(*in));
	if (!in)
		goto fail_nomem;
	for (size_t i = 0; i < z.count; i++) {
		bool is_pkl = &z.entries[i] == pe;

		in[i].record = z.entries[i].record;
		in[i].bytes = is_pkl ? conv : NULL;
		in[i].size = is_pkl ? conv_len : z.entries[i].size;
		in[i].provided = !is_pkl;
	}
	err = rs_zip_layout_build(&lay, z.archive, in, z.count, 0, 0);
	for (size_t i = 0; i < z.count && !err; i++)
		if (&z.entries[i] != pe && lay.entries[i].size)
			err = rs_zip_patch_crc(&lay, i, z.entries[i].crc32);
	for (size_t p = 0; p < lay.npieces && !err; p++) {
		const rs_zip_piece *pc = &lay.pieces[p];
		const rs_zip_entry *e = &z.entries[pc->entry];

		err = pc->kind == RS_ZIP_PIECE_LITERAL
			? rs_vtree_append_literal(t, file, pc->bytes, pc->length)
			: rs_vtree_append_source(t, file, o->source,
						 o->offset + e->offset,
						 e->size);
	}
	*length = lay.size;
	goto out;
fail_nomem:
	err = -ENOMEM;
	goto out;
fail:
	err = -EINVAL;
out:
	rs_zip_layout_free(&lay);
	free(in);
	free(conv);
	free(pkl);
	rs_zip_free(&z);
	return err;
}

int rs_torch_object_make(const void *pkl, size_t len, uint8_t **out,
			 size_t *out_len)
{
	rs_zip_layout l = { 0 };
	uint8_t *buf = NULL;
	int err = rs_zip_layout_torch_save(&l, "archive", pkl, len, NULL, 0);

	if (!err && !(buf = malloc(l.size ? l.size : 1)))
		err = -ENOMEM;
	for (size_t i = 0; i < l.npieces && !err; i++) {
		/* no storages: every piece is literal */
		if (l.pieces[i].kind != RS_ZIP_PIECE_LITERAL)
			err = -EINVAL;
		else
			memcpy(buf + l.pieces[i].offset, l.pieces[i].bytes,
			       l.pieces[i].length);
	}
	if (!err) {
		*out = buf;
		*out_len = l.size;
		buf = NULL;
	}
	free(buf);
	rs_zip_layout_free(&l);
	return err;
}
