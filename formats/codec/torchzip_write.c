/* torchzip writer: the layout of a torch.save zip, computed without data.
 *
 * Each record is written as PyTorchStreamWriter::writeRecord does through
 * miniz's mz_zip_writer_add_mem_ex_v2 in ZIP64 mode (torch's
 * caffe2/serialize/inline_container.cc and third_party/miniz):
 *   local header  version 0, flags 0x0808 (0x0800 when empty: no data
 *                 descriptor then), method 0, time/date 0, CRC and sizes 0;
 *   local extra   a ZIP64 field when size or offset >= 0xFFFFFFFF (size,
 *                 compressed size written as 0, offset), then 'FB' len
 *                 'Z'*len padding the data to the alignment;
 *   descriptor    PK 07 08, CRC, sizes (64-bit when the local header had a
 *                 ZIP64 field, else 32-bit), only for non-empty records;
 *   central       made-by and version 0, the same flags, CRC, sizes and
 *                 offset saturated at 0xFFFFFFFF with a ZIP64 extra field
 *                 carrying what is saturated, no timestamps, no attributes;
 * then the ZIP64 end record (made by 0x031E, needs 45), its locator and
 * the end record.
 */
#include "formats/codec/torchzip.h"

#include "planner/source.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define U32_SAT 0xFFFFFFFFu

typedef struct {
	uint8_t *p;
	size_t len, cap;
} buf;

static int reserve(buf *b, size_t more)
{
	size_t cap = b->cap ? b->cap : 256;
	uint8_t *p;

	if (more > SIZE_MAX - b->len)
		return -EFBIG;
	while (cap < b->len + more) {
		if (cap > SIZE_MAX / 2)
			return -EFBIG;
		cap *= 2;
	}
	if (cap == b->cap)
		return 0;
	p = realloc(b->p, cap);
	if (!p)
		return -ENOMEM;
	b->p = p;
	b->cap = cap;
	return 0;
}

/* Callers reserve first; these only store. */
static void put(buf *b, const void *src, size_t n)
{
	if (n)
		memcpy(b->p + b->len, src, n);
	b->len += n;
}

static void put16(buf *b, uint16_t v)
{
	uint8_t x[2] = { (uint8_t)v, (uint8_t)(v >> 8) };

	put(b, x, 2);
}

static void put32(buf *b, uint32_t v)
{
	put16(b, (uint16_t)v);
	put16(b, (uint16_t)(v >> 16));
}

static void put64(buf *b, uint64_t v)
{
	put32(b, (uint32_t)v);
	put32(b, (uint32_t)(v >> 32));
}

static uint32_t sat32(uint64_t v)
{
	return v < U32_SAT ? (uint32_t)v : U32_SAT;
}

static bool add_ok(uint64_t *a, uint64_t b)
{
	if (b > UINT64_MAX - *a)
		return false;
	*a += b;
	return true;
}

/* Appends a piece; literal pieces coalesce with a literal predecessor. */
static int add_piece(rs_zip_layout *l, size_t *cap, rs_zip_piece_kind kind,
		     uint64_t offset, uint64_t length, size_t lit_at,
		     size_t entry)
{
	rs_zip_piece *p;

	if (length == 0)
		return 0;
	if (kind == RS_ZIP_PIECE_LITERAL && l->npieces &&
	    l->pieces[l->npieces - 1].kind == RS_ZIP_PIECE_LITERAL) {
		l->pieces[l->npieces - 1].length += length;
		return 0;
	}
	if (l->npieces == *cap) {
		size_t n = *cap ? *cap * 2 : 8;
		rs_zip_piece *np = realloc(l->pieces, n * sizeof(*np));
		uint64_t *na = realloc(l->lit_at, n * sizeof(*na));

		if (np)
			l->pieces = np;
		if (na)
			l->lit_at = na;
		if (!np || !na)
			return -ENOMEM;
		*cap = n;
	}
	p = &l->pieces[l->npieces];
	*p = (rs_zip_piece){ .kind = kind, .offset = offset, .length = length,
			     .entry = entry };
	l->lit_at[l->npieces++] = lit_at;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}


static int check_inputs(const char *archive, const rs_zip_input *in,
			size_t n, uint32_t alignment)
{
	const char **names;
	int err = 0;

	if (!archive || !rs_name_is_safe(archive) || n == 0 ||
	    n > RS_ZIP_MAX_ENTRIES || alignment > 32768 ||
	    (alignment & (alignment - 1)))
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (!in[i].record || !rs_zip_record_ok(in[i].record) ||
		    strlen(archive) + 1 + strlen(in[i].record) > RS_ZIP_MAX_NAME)
			return -EINVAL;
		if (!in[i].provided && in[i].size &&
		    (!in[i].bytes || in[i].size > SIZE_MAX))
			return -EINVAL;
	}
	names = malloc(n * sizeof(*names));
	if (!names)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		names[i] = in[i].record;
	qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 1; i < n && !err; i++)
		if (strcmp(names[i - 1], names[i]) == 0)
			err = -EINVAL;
	free(names);
	return err;
}

typedef struct {
	rs_zip_layout *l;
	size_t piece_cap;
	buf lit, cd;
	uint64_t cursor;        /* zip offset of lit's end, data pieces included */
	uint32_t align;
	bool crc_zero;
	size_t *cd_crc_rel;     /* per entry: CRC field's offset in cd */
} builder;

/* Local header, extras, data (or a data piece) and data descriptor of one
 * record; its central record goes to b->cd. */
static int add_record(builder *b, const char *archive, const rs_zip_input *in,
		      size_t i)
{
	rs_zip_layout_entry *e = &b->l->entries[i];
	size_t alen = strlen(archive), rlen = strlen(in->record);
	size_t nlen = alen + 1 + rlen, x64, pad, lit_start = b->lit.len;
	uint64_t ho = b->cursor, size = in->size, start = ho, data;
	bool big_size = size >= U32_SAT, big_off = ho >= U32_SAT;
	uint16_t flags = size ? 0x0808 : 0x0800;
	uint32_t crc = 0;
	int err;

	/* The padding is computed as torch's getPadding does: from the end
	 * of the local header, name, ZIP64 extra and the 'FB' field header. */
	x64 = (big_size || big_off) ? 4 + (big_size ? 16 : 0) + (big_off ? 8 : 0) : 0;
	if (!add_ok(&start, 30 + nlen + x64 + 4))
		return -EFBIG;
	pad = (size_t)((b->align - start % b->align) % b->align);
	data = start + pad;

	err = reserve(&b->lit, 30 + nlen + x64 + 4 + pad);
	if (err)
		return err;
	put32(&b->lit, 0x04034b50u);
	put16(&b->lit, 0);
	put16(&b->lit, flags);
	put16(&b->lit, 0);              /* method: stored */
	put32(&b->lit, 0);              /* time, date */
	put32(&b->lit, 0);              /* CRC: in the descriptor */
	put64(&b->lit, 0);              /* sizes: in the descriptor */
	put16(&b->lit, (uint16_t)nlen);
	put16(&b->lit, (uint16_t)(x64 + 4 + pad));
	put(&b->lit, archive, alen);
	put(&b->lit, "/", 1);
	put(&b->lit, in->record, rlen);
	if (x64) {
		put16(&b->lit, 0x0001);
		put16(&b->lit, (uint16_t)(x64 - 4));
		if (big_size) {
			put64(&b->lit, size);
			put64(&b->lit, 0);      /* miniz writes it before compressing */
		}
		if (big_off)
			put64(&b->lit, ho);
	}
	put(&b->lit, "FB", 2);
	put16(&b->lit, (uint16_t)pad);
	memset(b->lit.p + b->lit.len, 'Z', pad);
	b->lit.len += pad;

	e->header_offset = ho;
	e->offset = data;
	e->size = size;
	e->provided = in->provided;
	if (in->provided) {
		err = add_piece(b->l, &b->piece_cap, RS_ZIP_PIECE_LITERAL, ho,
				b->lit.len - lit_start, lit_start, 0);
		if (!err)
			err = add_piece(b->l, &b->piece_cap, RS_ZIP_PIECE_DATA,
					data, size, 0, i);
		if (err)
			return err;
		lit_start = b->lit.len;
		e->crc_pending = size && !b->crc_zero;
	} else {
		err = reserve(&b->lit, (size_t)size);
		if (err)
			return err;
		put(&b->lit, in->bytes, (size_t)size);
		crc = (uint32_t)crc32_z(0, in->bytes, (size_t)size);
	}
	b->cursor = data;
	if (!add_ok(&b->cursor, size))
		return -EFBIG;

	if (size) {
		uint64_t desc = b->cursor;

		err = reserve(&b->lit, 24);
		if (err)
			return err;
		e->ncrc = 2;
		e->crc_lit[0] = b->lit.len + 4;
		e->crc_at[0] = desc + 4;
		put32(&b->lit, 0x08074b50u);
		put32(&b->lit, crc);
		if (x64) {
			put64(&b->lit, size);
			put64(&b->lit, size);
		} else {
			put32(&b->lit, (uint32_t)size);
			put32(&b->lit, (uint32_t)size);
		}
		if (!add_ok(&b->cursor, x64 ? 24 : 16))
			return -EFBIG;
	}
	e->crc32 = crc;
	err = add_piece(b->l, &b->piece_cap, RS_ZIP_PIECE_LITERAL,
			in->provided ? data + size : ho, b->lit.len - lit_start,
			lit_start, 0);
	if (err)
		return err;

	/* Central record.  miniz refuses central directories of 4 GiB. */
	x64 = (big_size || big_off) ? 4 + (big_size ? 16 : 0) + (big_off ? 8 : 0) : 0;
	if ((uint64_t)b->cd.len + 46 + nlen + 28 >= U32_SAT)
		return -EFBIG;
	err = reserve(&b->cd, 46 + nlen + x64);
	if (err)
		return err;
	put32(&b->cd, 0x02014b50u);
	put16(&b->cd, 0);               /* made by */
	put16(&b->cd, 0);               /* needed */
	put16(&b->cd, flags);
	put16(&b->cd, 0);
	put32(&b->cd, 0);
	b->cd_crc_rel[i] = b->cd.len;
	put32(&b->cd, crc);
	put32(&b->cd, sat32(size));
	put32(&b->cd, sat32(size));
	put16(&b->cd, (uint16_t)nlen);
	put16(&b->cd, (uint16_t)x64);
	put16(&b->cd, 0);               /* comment */
	put16(&b->cd, 0);               /* disk */
	put16(&b->cd, 0);               /* internal attributes */
	put32(&b->cd, 0);               /* external attributes */
	put32(&b->cd, sat32(ho));
	put(&b->cd, archive, alen);
	put(&b->cd, "/", 1);
	put(&b->cd, in->record, rlen);
	if (x64) {
		put16(&b->cd, 0x0001);
		put16(&b->cd, (uint16_t)(x64 - 4));
		if (big_size) {
			put64(&b->cd, size);
			put64(&b->cd, size);
		}
		if (big_off)
			put64(&b->cd, ho);
	}
	return 0;
}

/* Central directory, ZIP64 end record, locator, end record. */
static int add_trailer(builder *b, size_t n)
{
	rs_zip_layout *l = b->l;
	uint64_t cd_off = b->cursor, cd_size = b->cd.len, rec = cd_off + cd_size;
	size_t lit_start = b->lit.len;
	int err;

	err = reserve(&b->lit, b->cd.len + 56 + 20 + 22);
	if (err)
		return err;
	put(&b->lit, b->cd.p, b->cd.len);
	for (size_t i = 0; i < n; i++) {
		rs_zip_layout_entry *e = &l->entries[i];

		if (e->ncrc) {
			e->crc_lit[1] = lit_start + b->cd_crc_rel[i];
			e->crc_at[1] = cd_off + b->cd_crc_rel[i];
		}
	}
	put32(&b->lit, 0x06064b50u);
	put64(&b->lit, 44);
	put16(&b->lit, 0x031E);
	put16(&b->lit, 0x002D);
	put32(&b->lit, 0);
	put32(&b->lit, 0);
	put64(&b->lit, n);
	put64(&b->lit, n);
	put64(&b->lit, cd_size);
	put64(&b->lit, cd_off);

	put32(&b->lit, 0x07064b50u);
	put32(&b->lit, 0);
	put64(&b->lit, rec);
	put32(&b->lit, 1);

	put32(&b->lit, 0x06054b50u);
	put16(&b->lit, 0);
	put16(&b->lit, 0);
	put16(&b->lit, n < 0xFFFF ? (uint16_t)n : 0xFFFF);
	put16(&b->lit, n < 0xFFFF ? (uint16_t)n : 0xFFFF);
	put32(&b->lit, sat32(cd_size));
	put32(&b->lit, sat32(cd_off));
	put16(&b->lit, 0);

	b->cursor = rec;
	if (!add_ok(&b->cursor, 56 + 20 + 22) || b->cursor > INT64_MAX)
		return -EFBIG;
	return add_piece(l, &b->piece_cap, RS_ZIP_PIECE_LITERAL, cd_off,
			 b->lit.len - lit_start, lit_start, 0);
}

int rs_zip_layout_build(rs_zip_layout *l, const char *archive,
			const rs_zip_input *in, size_t n, uint32_t alignment,
			unsigned flags)
{
	builder b = { .l = l, .align = alignment ? alignment : RS_ZIP_ALIGNMENT,
		      .crc_zero = flags & RS_ZIP_CRC_ZERO };
	int err;

	memset(l, 0, sizeof(*l));
	err = check_inputs(archive, in, n, alignment);
	if (err)
		return err;
	l->entries = calloc(n, sizeof(*l->entries));
	b.cd_crc_rel = calloc(n, sizeof(size_t));
	if (!l->entries || !b.cd_crc_rel) {
		err = -ENOMEM;
		goto out;
	}
	l->count = n;
	for (size_t i = 0; i < n && !err; i++)
		err = add_record(&b, archive, &in[i], i);
	if (!err)
		err = add_trailer(&b, n);
	if (err)
		goto out;
	l->lit = b.lit.p;
	l->lit_len = b.lit.len;
	b.lit.p = NULL;
	l->size = b.cursor;
	/* The literal buffer no longer moves: pieces may point into it. */
	for (size_t i = 0; i < l->npieces; i++)
		if (l->pieces[i].kind == RS_ZIP_PIECE_LITERAL)
			l->pieces[i].bytes = l->lit + l->lit_at[i];
out:
	free(b.lit.p);
	free(b.cd.p);
	free(b.cd_crc_rel);
	if (err)
		rs_zip_layout_free(l);
	return err;
}

void rs_zip_layout_free(rs_zip_layout *l)
{
	free(l->entries);
	free(l->pieces);
	free(l->lit);
	free(l->lit_at);
	memset(l, 0, sizeof(*l));
}

int rs_zip_layout_torch_save(rs_zip_layout *l, const char *archive,
			     const void *pkl, size_t pkl_len,
			     const uint64_t *sizes, size_t n)
{
	static const char serial_id[] = "0000000000000000000000000000000000000000";
	const size_t first = RS_ZIP_TORCH_SAVE_STORAGE0;
	rs_zip_input *in;
	char (*names)[32];
	int err;

	memset(l, 0, sizeof(*l));
	if (n > SIZE_MAX / sizeof(*names) - first - 2)
		return -EFBIG;
	in = calloc(n + first + 2, sizeof(*in));
	names = calloc(n + 1, sizeof(*names));
	if (!in || !names) {
		free(in);
		free(names);
		return -ENOMEM;
	}
	in[0] = (rs_zip_input){ "data.pkl", pkl, pkl_len, false };
	in[1] = (rs_zip_input){ ".format_version", "1", 1, false };
	in[2] = (rs_zip_input){ ".storage_alignment", "64", 2, false };
	in[3] = (rs_zip_input){ "byteorder", "little", 6, false };
	for (size_t k = 0; k < n; k++) {
		snprintf(names[k], sizeof(names[k]), "data/%zu", k);
		in[first + k] = (rs_zip_input){ names[k], NULL, sizes[k], true };
	}
	in[first + n] = (rs_zip_input){ "version", "3\n", 2, false };
	in[first + n + 1] = (rs_zip_input){ ".data/serialization_id",
					     serial_id, 40, false };
	err = rs_zip_layout_build(l, archive, in, n + first + 2, 0,
				  RS_ZIP_CRC_ZERO);
	free(names);
	free(in);
	return err;
}

int rs_zip_patch_crc(rs_zip_layout *l, size_t entry, uint32_t crc)
{
	rs_zip_layout_entry *e;

	if (entry >= l->count || !l->entries[entry].provided)
		return -EINVAL;
	e = &l->entries[entry];
	for (int k = 0; k < e->ncrc; k++) {
		uint8_t *p = l->lit + e->crc_lit[k];

		p[0] = (uint8_t)crc;
		p[1] = (uint8_t)(crc >> 8);
		p[2] = (uint8_t)(crc >> 16);
		p[3] = (uint8_t)(crc >> 24);
	}
	if (e->ncrc)
		e->crc32 = crc;
	e->crc_pending = false;
	return 0;
}

size_t rs_zip_layout_pending(const rs_zip_layout *l)
{
	size_t n = 0;

	for (size_t i = 0; i < l->count; i++)
		n += l->entries[i].crc_pending;
	return n;
}
