/* torchzip reader: end records, central directory and local headers of a
 * zip embedded at [base, base+len) of a descriptor.  Entry data is never
 * read. */
#include "formats/codec/torchzip.h"

#include "planner/source.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EOCD_SIZE 22u
#define EOCD_MAX_COMMENT 65535u
#define LOC64_SIZE 20u
#define EOCD64_SIZE 56u
#define CDH_SIZE 46u
#define LFH_SIZE 30u

#define SIG_LFH 0x04034b50u
#define SIG_CDH 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u

#define FLAG_ENCRYPTED 0x0001u
#define FLAG_STRONG_ENCRYPTION 0x0040u
#define EXTRA_ZIP64 0x0001u

static uint16_t le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

typedef struct {
	int fd;
	uint64_t base, len;
	char *msg;
	size_t msg_size;
} src;

static int fail(src *s, int err, uint64_t off, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(src *s, int err, uint64_t off, const char *fmt, ...)
{
	char what[RS_ZIP_MSG_SIZE];
	va_list ap;

	if (s->msg_size) {
		va_start(ap, fmt);
		vsnprintf(what, sizeof(what), fmt, ap);
		va_end(ap);
		snprintf(s->msg, s->msg_size, "zip: %s (offset %llu)", what,
			 (unsigned long long)off);
	}
	return err;
}

/* Reads n bytes at zip offset off; the range must lie inside the zip. */
static int read_at(src *s, uint64_t off, void *buf, size_t n)
{
	uint8_t *p = buf;
	size_t done = 0;

	if (off > s->len || n > s->len - off)
		return fail(s, -EINVAL, off, "%zu bytes past the end of the zip", n);
	while (done < n) {
		/* base + len was checked not to overflow, and pread's offset
		 * is signed: rs_zip_open refused ranges past INT64_MAX. */
		ssize_t r = pread(s->fd, p + done, n - done,
				  (off_t)(s->base + off + done));

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;

			return fail(s, -e, off, "read failed: %s", strerror(e));
		}
		if (r == 0)
			return fail(s, -EINVAL, off + done,
				    "file ends inside the zip");
		done += (size_t)r;
	}
	return 0;
}

/* Position of the end of central directory record.  torch writes no
 * comment, so the last 22 bytes are tried first; otherwise the tail is
 * searched backwards for a record whose comment ends the zip exactly. */
static int find_eocd(src *s, uint64_t *pos)
{
	uint8_t last[EOCD_SIZE], *tail;
	size_t tail_len;
	int err;

	if (s->len < EOCD_SIZE)
		return fail(s, -EINVAL, 0, "%llu bytes is too small for a zip",
			    (unsigned long long)s->len);
	err = read_at(s, s->len - EOCD_SIZE, last, EOCD_SIZE);
	if (err)
		return err;
	if (le32(last) == SIG_EOCD && le16(last + 20) == 0) {
		*pos = s->len - EOCD_SIZE;
		return 0;
	}
	tail_len = s->len < EOCD_SIZE + EOCD_MAX_COMMENT ?
		(size_t)s->len : EOCD_SIZE + EOCD_MAX_COMMENT;
	tail = malloc(tail_len);
	if (!tail)
		return -ENOMEM;
	err = read_at(s, s->len - tail_len, tail, tail_len);
	if (!err) {
		err = fail(s, -EINVAL, s->len, "no end of central directory record");
		for (size_t i = tail_len - EOCD_SIZE + 1; i-- > 0;) {
			if (le32(tail + i) == SIG_EOCD &&
			    i + EOCD_SIZE + le16(tail + i + 20) == tail_len) {
				*pos = s->len - tail_len + i;
				err = 0;
				break;
			}
		}
	}
	free(tail);
	return err;
}

typedef struct {
	uint64_t count, cd_size, cd_offset, cd_end;
	bool zip64;
} end_info;

/* The ZIP64 locator just before the end record, and the ZIP64 end record
 * it points to, which must end exactly at the locator. */
static int read_zip64(src *s, uint64_t eocd, end_info *e)
{
	uint8_t loc[LOC64_SIZE], rec[EOCD64_SIZE];
	uint64_t loc_pos, rec_off, rec_size;
	int err;

	if (eocd < LOC64_SIZE)
		return 0;
	loc_pos = eocd - LOC64_SIZE;
	err = read_at(s, loc_pos, loc, sizeof(loc));
	if (err)
		return err;
	if (le32(loc) != SIG_LOC64)
		return 0;
	if (le32(loc + 4) != 0 || le32(loc + 16) > 1)
		return fail(s, -EINVAL, loc_pos, "multi-disk zip64 locator");
	rec_off = le64(loc + 8);
	if (loc_pos < EOCD64_SIZE || rec_off > loc_pos - EOCD64_SIZE)
		return fail(s, -EINVAL, loc_pos,
			    "zip64 end record offset %llu out of range",
			    (unsigned long long)rec_off);
	err = read_at(s, rec_off, rec, sizeof(rec));
	if (err)
		return err;
	rec_size = le64(rec + 4);
	if (le32(rec) != SIG_EOCD64)
		return fail(s, -EINVAL, rec_off, "bad zip64 end record signature");
	if (rec_size < EOCD64_SIZE - 12 || rec_size != loc_pos - rec_off - 12)
		return fail(s, -EINVAL, rec_off,
			    "zip64 end record size %llu does not reach the locator",
			    (unsigned long long)rec_size);
	if (le32(rec + 16) != 0 || le32(rec + 20) != 0 ||
	    le64(rec + 24) != le64(rec + 32))
		return fail(s, -EINVAL, rec_off, "multi-disk zip64 end record");
	e->zip64 = true;
	e->count = le64(rec + 32);
	e->cd_size = le64(rec + 40);
	e->cd_offset = le64(rec + 48);
	e->cd_end = rec_off;
	return 0;
}

static int read_end(src *s, end_info *e)
{
	uint8_t r[EOCD_SIZE];
	uint64_t pos = 0;
	uint16_t n;
	uint32_t size, off;
	int err;

	err = find_eocd(s, &pos);
	if (!err)
		err = read_at(s, pos, r, sizeof(r));
	if (err)
		return err;
	n = le16(r + 10);
	size = le32(r + 12);
	off = le32(r + 16);
	if (le16(r + 4) != 0 || le16(r + 6) != 0 || le16(r + 8) != n)
		return fail(s, -EINVAL, pos, "multi-disk zip");
	*e = (end_info){ .count = n, .cd_size = size, .cd_offset = off,
			 .cd_end = pos };
	err = read_zip64(s, pos, e);
	if (err)
		return err;
	/* A 32-bit field that is not saturated must say what ZIP64 says. */
	if (e->zip64 && ((n != 0xFFFF && n != e->count) ||
			 (size != 0xFFFFFFFFu && size != e->cd_size) ||
			 (off != 0xFFFFFFFFu && off != e->cd_offset)))
		return fail(s, -EINVAL, pos,
			    "end record disagrees with the zip64 end record");
	if (e->cd_size > e->cd_end || e->cd_offset != e->cd_end - e->cd_size)
		return fail(s, -EINVAL, e->cd_end,
			    "central directory [%llu, +%llu) does not end at its end record",
			    (unsigned long long)e->cd_offset,
			    (unsigned long long)e->cd_size);
	if (e->count == 0)
		return fail(s, -EINVAL, pos, "no entries");
	if (e->count > RS_ZIP_MAX_ENTRIES || e->cd_size > RS_ZIP_MAX_CD_BYTES)
		return fail(s, -EINVAL, pos,
			    "%llu entries in %llu bytes is over the limit",
			    (unsigned long long)e->count,
			    (unsigned long long)e->cd_size);
	if (e->count > e->cd_size / CDH_SIZE)
		return fail(s, -EINVAL, pos,
			    "%llu entries cannot fit in %llu bytes",
			    (unsigned long long)e->count,
			    (unsigned long long)e->cd_size);
	return 0;
}

/* Replaces saturated 32-bit fields by those of the ZIP64 extra field, in
 * the order the format fixes (size, compressed size, offset, disk). */
static int apply_zip64(src *s, uint64_t at, const uint8_t *x, size_t xlen,
		       uint64_t *size, uint64_t *csize, uint64_t *ho,
		       uint32_t *disk)
{
	bool seen = false;

	while (xlen) {
		uint16_t id, dlen;
		const uint8_t *d;
		size_t need = 0;

		if (xlen < 4)
			return fail(s, -EINVAL, at, "truncated extra field");
		id = le16(x);
		dlen = le16(x + 2);
		if (dlen > xlen - 4)
			return fail(s, -EINVAL, at, "extra field overruns its entry");
		d = x + 4;
		if (id == EXTRA_ZIP64) {
			if (seen)
				return fail(s, -EINVAL, at, "two zip64 extra fields");
			seen = true;
			need = (*size == 0xFFFFFFFFu) * 8 +
			       (*csize == 0xFFFFFFFFu) * 8 +
			       (*ho == 0xFFFFFFFFu) * 8 + (*disk == 0xFFFF) * 4;
			if (dlen < need)
				return fail(s, -EINVAL, at, "zip64 extra field too short");
			if (*size == 0xFFFFFFFFu) {
				*size = le64(d);
				d += 8;
			}
			if (*csize == 0xFFFFFFFFu) {
				*csize = le64(d);
				d += 8;
			}
			if (*ho == 0xFFFFFFFFu) {
				*ho = le64(d);
				d += 8;
			}
			if (*disk == 0xFFFF)
				*disk = le32(d);
		}
		x += 4 + (size_t)dlen;
		xlen -= 4 + (size_t)dlen;
	}
	if (!seen && (*size == 0xFFFFFFFFu || *csize == 0xFFFFFFFFu ||
		      *ho == 0xFFFFFFFFu || *disk == 0xFFFF))
		return fail(s, -EINVAL, at, "saturated field without a zip64 extra");
	return 0;
}

/* One central directory record at cd[*pos]; advances *pos. */
static int parse_central(src *s, const end_info *e, const uint8_t *cd,
			 size_t *pos, rs_zip_entry *out, char *name_buf)
{
	const uint8_t *h = cd + *pos;
	uint64_t at = e->cd_offset + *pos;
	size_t left = (size_t)e->cd_size - *pos, nlen, xlen, clen;
	uint16_t flags, method;
	uint64_t size, csize, ho;
	uint32_t disk;
	int err;

	if (left < CDH_SIZE)
		return fail(s, -EINVAL, at, "central directory ends inside a record");
	if (le32(h) != SIG_CDH)
		return fail(s, -EINVAL, at, "bad central directory signature");
	flags = le16(h + 8);
	method = le16(h + 10);
	size = le32(h + 24);
	csize = le32(h + 20);
	nlen = le16(h + 28);
	xlen = le16(h + 30);
	clen = le16(h + 32);
	disk = le16(h + 34);
	ho = le32(h + 42);
	if (CDH_SIZE + nlen + xlen + clen > left)
		return fail(s, -EINVAL, at, "central record overruns the directory");
	if (flags & (FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION))
		return fail(s, -EINVAL, at, "encrypted entry");
	if (method != 0)
		return fail(s, -EINVAL, at, "compressed entry (method %u)", method);
	if (nlen == 0 || nlen > RS_ZIP_MAX_NAME)
		return fail(s, -EINVAL, at, "entry name of %zu bytes", nlen);
	err = apply_zip64(s, at, h + CDH_SIZE + nlen, xlen, &size, &csize,
			  &ho, &disk);
	if (err)
		return err;
	if (disk != 0)
		return fail(s, -EINVAL, at, "entry on disk %u", disk);
	if (csize != size)
		return fail(s, -EINVAL, at,
			    "stored entry with compressed size %llu != size %llu",
			    (unsigned long long)csize, (unsigned long long)size);
	memcpy(name_buf, h + CDH_SIZE, nlen);
	name_buf[nlen] = '\0';
	if (strlen(name_buf) != nlen)
		return fail(s, -EINVAL, at, "NUL in entry name");
	out->name = name_buf;
	out->header_offset = ho;
	out->size = size;
	out->crc32 = le32(h + 16);
	*pos += CDH_SIZE + nlen + xlen + clen;
	return 0;
}

bool rs_zip_record_ok(const char *r)
{
	const char *c = r;

	for (const char *p = r;; p++) {
		if (*p == '/' || *p == '\0') {
			size_t n = (size_t)(p - c);

			if (n == 0 || (n == 1 && c[0] == '.') ||
			    (n == 2 && c[0] == '.' && c[1] == '.'))
				return false;
			if (*p == '\0')
				return true;
			c = p + 1;
		} else if (*p == '\\' || (unsigned char)*p < 0x20 || *p == 0x7f) {
			return false;
		}
	}
}

/* Takes the archive prefix from the first entry and checks every name. */
static int check_names(src *s, rs_zip *z)
{
	const char *first = z->entries[0].name, *slash = strchr(first, '/');
	size_t plen;

	if (!slash)
		return fail(s, -EINVAL, z->entries[0].header_offset,
			    "first entry \"%.64s\" is not under an archive directory",
			    first);
	plen = (size_t)(slash - first);
	z->archive = strndup(first, plen);
	if (!z->archive)
		return -ENOMEM;
	if (!rs_name_is_safe(z->archive))
		return fail(s, -EINVAL, z->entries[0].header_offset,
			    "unsafe archive name \"%.64s\"", z->archive);
	for (size_t i = 0; i < z->count; i++) {
		rs_zip_entry *e = &z->entries[i];

		if (strncmp(e->name, first, plen + 1) != 0)
			return fail(s, -EINVAL, e->header_offset,
				    "entry \"%.64s\" is outside archive \"%s\"",
				    e->name, z->archive);
		e->record = e->name + plen + 1;
		if (!rs_zip_record_ok(e->record))
			return fail(s, -EINVAL, e->header_offset,
				    "bad entry name \"%.64s\"", e->name);
	}
	return 0;
}

/* Sorted index for lookups; equal neighbours are duplicate names. */
static int index_names(src *s, rs_zip *z)
{
	z->by_name = malloc(z->count * sizeof(size_t));
	if (!z->by_name)
		return -ENOMEM;
	for (size_t i = 0; i < z->count; i++)
		z->by_name[i] = i;
	/* qsort has no context argument: a bottom-up merge sort keeps this
	 * free of globals, so threads may parse zips at once. */
	for (size_t w = 1; w < z->count; w *= 2) {
		size_t *tmp = malloc(z->count * sizeof(size_t));

		if (!tmp)
			return -ENOMEM;
		for (size_t lo = 0; lo < z->count; lo += 2 * w) {
			size_t mid = lo + w < z->count ? lo + w : z->count;
			size_t hi = lo + 2 * w < z->count ? lo + 2 * w : z->count;
			size_t i = lo, j = mid, k = lo;

			while (i < mid && j < hi) {
				if (strcmp(z->entries[z->by_name[j]].record,
					   z->entries[z->by_name[i]].record) < 0)
					tmp[k++] = z->by_name[j++];
				else
					tmp[k++] = z->by_name[i++];
			}
			while (i < mid)
				tmp[k++] = z->by_name[i++];
			while (j < hi)
				tmp[k++] = z->by_name[j++];
		}
		free(z->by_name);
		z->by_name = tmp;
	}
	for (size_t i = 1; i < z->count; i++) {
		const rs_zip_entry *e = &z->entries[z->by_name[i]];

		if (strcmp(e->record, z->entries[z->by_name[i - 1]].record) == 0)
			return fail(s, -EINVAL, e->header_offset,
				    "duplicate entry \"%.64s\"", e->name);
	}
	return 0;
}

/* The local header: same name, STORED; its extra length places the data,
 * which must end before the central directory. */
static int read_local(src *s, const end_info *e, rs_zip_entry *ent)
{
	uint8_t h[LFH_SIZE + RS_ZIP_MAX_NAME];
	size_t nlen = strlen(ent->name);
	uint64_t ho = ent->header_offset, data;
	int err;

	if (ho > e->cd_offset || e->cd_offset - ho < LFH_SIZE + nlen)
		return fail(s, -EINVAL, ho, "local header of \"%.64s\" is not "
			    "before the central directory", ent->name);
	err = read_at(s, ho, h, LFH_SIZE + nlen);
	if (err)
		return err;
	if (le32(h) != SIG_LFH)
		return fail(s, -EINVAL, ho, "bad local header signature");
	if (le16(h + 6) & (FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION))
		return fail(s, -EINVAL, ho, "encrypted entry");
	if (le16(h + 8) != 0)
		return fail(s, -EINVAL, ho, "compressed entry (method %u)",
			    le16(h + 8));
	if (le16(h + 26) != nlen || memcmp(h + LFH_SIZE, ent->name, nlen) != 0)
		return fail(s, -EINVAL, ho,
			    "local name differs from the central directory's");
	data = ho + LFH_SIZE + nlen + le16(h + 28);
	if (data > e->cd_offset || ent->size > e->cd_offset - data)
		return fail(s, -EINVAL, ho, "data of \"%.64s\" (%llu bytes) runs "
			    "past the central directory", ent->name,
			    (unsigned long long)ent->size);
	ent->offset = data;
	return 0;
}

typedef struct {
	uint64_t start, end;
} span;

static int cmp_span(const void *a, const void *b)
{
	const span *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

/* Each entry, from its local header to its data's end, must end before
 * the next one begins (CPython's overlap check, CVE-2024-0450). */
static int check_overlap(src *s, const rs_zip *z)
{
	span *sp = malloc(z->count * sizeof(span));
	int err = 0;

	if (!sp)
		return -ENOMEM;
	for (size_t i = 0; i < z->count; i++)
		sp[i] = (span){ z->entries[i].header_offset,
				z->entries[i].offset + z->entries[i].size };
	qsort(sp, z->count, sizeof(span), cmp_span);
	for (size_t i = 1; i < z->count && !err; i++)
		if (sp[i].start < sp[i - 1].end)
			err = fail(s, -EINVAL, sp[i].start, "overlapping entries");
	free(sp);
	return err;
}

/* torch.save records the byte order of its storages (from torch 1.x):
 * torch.load byteswaps a "big" file's tensors on a little-endian machine,
 * so serving its bytes as they are would give other values.  Every reader
 * of these zips refuses one here rather than each on its own. */
static int check_byteorder(src *s, const rs_zip *z)
{
	const rs_zip_entry *bo = rs_zip_find(z, "byteorder");
	char text[16] = { 0 };
	int err;

	if (!bo)
		return 0;
	if (bo->size >= sizeof(text))
		return fail(s, -EINVAL, bo->offset, "byteorder record of %llu bytes",
			    (unsigned long long)bo->size);
	err = read_at(s, bo->offset, text, (size_t)bo->size);
	if (err)
		return err;
	if (strcmp(text, "little") == 0)
		return 0;
	for (char *p = text; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
			*p = '?';
	return fail(s, -EINVAL, bo->offset,
		    "byteorder \"%s\": only little-endian torch.save files are read (load and save it again on a little-endian machine)",
		    text);
}

/* torch.save's pre-1.6 format (still written with
 * _use_new_zipfile_serialization=False) is a run of pickles, the first
 * the magic number 0x1950a86a20f9469cfc6c: LONG1 of these bytes, after
 * PROTO (and a FRAME under protocol 4 and 5). */
static bool legacy_torch_save(src *s)
{
	static const uint8_t magic[] = { 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
					 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19 };
	uint8_t head[24];
	size_t n = s->len < sizeof(head) ? (size_t)s->len : sizeof(head);

	if (n < sizeof(magic) ||
	    rs_pread_full(s->fd, head, n, s->base) != 0)
		return false;
	for (size_t i = 0; i + sizeof(magic) <= n; i++)
		if (memcmp(head + i, magic, sizeof(magic)) == 0)
			return true;
	return false;
}

int rs_zip_open(rs_zip *z, int fd, uint64_t base, uint64_t len, char *msg,
		size_t msg_size)
{
	src s = { fd, base, len, msg, msg_size };
	end_info e;
	uint8_t *cd = NULL;
	size_t pos = 0, names_used = 0;
	int err;

	memset(z, 0, sizeof(*z));
	if (msg_size)
		msg[0] = '\0';
	if (base > INT64_MAX || len > (uint64_t)INT64_MAX - base)
		return fail(&s, -EINVAL, 0, "range past the largest file offset");
	err = read_end(&s, &e);
	if (err == -EINVAL && legacy_torch_save(&s)) {
		if (msg_size)
			snprintf(msg, msg_size, "a torch.save file in the legacy format (torch < 1.6, or _use_new_zipfile_serialization=False), which reshardfs does not read; re-save it: python -c \"import torch; torch.save(torch.load('F', weights_only=False), 'F2')\"");
		goto out;
	}
	if (err)
		goto out;
	cd = malloc(e.cd_size ? (size_t)e.cd_size : 1);
	z->entries = calloc((size_t)e.count, sizeof(rs_zip_entry));
	/* Names are at most the directory's size, plus their NULs. */
	z->names = malloc((size_t)e.cd_size + (size_t)e.count);
	if (!cd || !z->entries || !z->names) {
		err = -ENOMEM;
		goto out;
	}
	err = read_at(&s, e.cd_offset, cd, (size_t)e.cd_size);
	if (err)
		goto out;
	z->count = (size_t)e.count;
	for (size_t i = 0; i < z->count; i++) {
		err = parse_central(&s, &e, cd, &pos, &z->entries[i],
				    z->names + names_used);
		if (err)
			goto out;
		names_used += strlen(z->entries[i].name) + 1;
	}
	if (pos != e.cd_size) {
		err = fail(&s, -EINVAL, e.cd_offset + pos,
			   "%llu bytes after the last central record",
			   (unsigned long long)(e.cd_size - pos));
		goto out;
	}
	err = check_names(&s, z);
	if (!err)
		err = index_names(&s, z);
	for (size_t i = 0; i < z->count && !err; i++)
		err = read_local(&s, &e, &z->entries[i]);
	if (!err)
		err = check_overlap(&s, z);
	if (!err)
		err = check_byteorder(&s, z);
	if (err)
		goto out;
	z->cd_offset = e.cd_offset;
	z->cd_size = e.cd_size;
	z->zip64 = e.zip64;
out:
	free(cd);
	if (err) {
		if (err == -ENOMEM && msg_size && !msg[0])
			snprintf(msg, msg_size, "zip: out of memory");
		rs_zip_free(z);
	}
	return err;
}

void rs_zip_free(rs_zip *z)
{
	free(z->archive);
	free(z->entries);
	free(z->names);
	free(z->by_name);
	memset(z, 0, sizeof(*z));
}

const rs_zip_entry *rs_zip_find(const rs_zip *z, const char *record)
{
	size_t lo = 0, hi = z->count;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const rs_zip_entry *e = &z->entries[z->by_name[mid]];
		int c = strcmp(record, e->record);

		if (c == 0)
			return e;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}
