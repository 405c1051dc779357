/* fuzz_zip: the torch.save zip reader on a hostile zip.
 *
 * The input is the whole zip.  It is opened twice from one memfd: alone
 * (base 0), and embedded between garbage at an odd offset, as an item of a
 * .distcp is.  Both opens must give the same answer, entry for entry, and
 * the embedded one must never look past its range.  Of an accepted zip the
 * header's promises are checked: names unique, safe and under one archive,
 * found by rs_zip_find; every entry's data inside the range, before the
 * central directory and overlapping no other entry.  Then every entry's
 * data is read whole, as readers of the zip do.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "formats/codec/torchzip.h"
#include "tests/fuzz/fuzz.h"

/* Garbage around the embedded copy: the reader must not use it. */
#define PREFIX 13u
#define SUFFIX 29u

static int memfd(void)
{
	static int fd = -1;

	if (fd < 0) {
		fd = memfd_create("fuzz_zip", MFD_CLOEXEC);
		RS_FUZZ_CHECK(fd >= 0);
	}
	return fd;
}

static void put(int fd, const void *p, size_t n, off_t at)
{
	RS_FUZZ_CHECK(pwrite(fd, p, n, at) == (ssize_t)n);
}

static void check_entries(const rs_zip *z, int fd, uint64_t base,
			  uint64_t len)
{
	RS_FUZZ_CHECK(z->count >= 1 && z->archive && z->archive[0]);
	RS_FUZZ_CHECK(z->cd_offset + z->cd_size <= len);
	for (size_t i = 0; i < z->count; i++) {
		const rs_zip_entry *e = &z->entries[i];
		size_t plen = strlen(z->archive);
		uint8_t *buf;

		RS_FUZZ_CHECK(strncmp(e->name, z->archive, plen) == 0 &&
			      e->name[plen] == '/' && e->record == e->name + plen + 1);
		RS_FUZZ_CHECK(strlen(e->name) <= RS_ZIP_MAX_NAME);
		RS_FUZZ_CHECK(rs_zip_record_ok(e->record));
		RS_FUZZ_CHECK(rs_zip_find(z, e->record) == e);
		RS_FUZZ_CHECK(e->header_offset + 30 <= e->offset);
		RS_FUZZ_CHECK(e->offset <= z->cd_offset &&
			      e->size <= z->cd_offset - e->offset);
		for (size_t j = 0; j < i; j++) {
			const rs_zip_entry *o = &z->entries[j];

			RS_FUZZ_CHECK(e->offset + e->size <= o->header_offset ||
				      o->offset + o->size <= e->header_offset);
		}
		buf = malloc(e->size ? e->size : 1);
		if (!buf)
			continue;
		RS_FUZZ_CHECK(pread(fd, buf, e->size, (off_t)(base + e->offset)) ==
			      (ssize_t)e->size);
		(void)crc32(0, buf, (uInt)e->size);
		free(buf);
	}
	RS_FUZZ_CHECK(rs_zip_find(z, "") == NULL);
}

static bool same(const rs_zip *a, const rs_zip *b)
{
	if (a->count != b->count || a->cd_offset != b->cd_offset ||
	    a->cd_size != b->cd_size || a->zip64 != b->zip64 ||
	    strcmp(a->archive, b->archive) != 0)
		return false;
	for (size_t i = 0; i < a->count; i++) {
		const rs_zip_entry *x = &a->entries[i], *y = &b->entries[i];

		if (strcmp(x->name, y->name) != 0 ||
		    x->header_offset != y->header_offset ||
		    x->offset != y->offset || x->size != y->size ||
		    x->crc32 != y->crc32)
			return false;
	}
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t junk[PREFIX + SUFFIX] =
		"PK\x05\x06PK\x01\x02PK\x03\x04PK\x06\x06PK\x06\x07"
		"\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00";
	char msg[RS_ZIP_MSG_SIZE], msg2[RS_ZIP_MSG_SIZE];
	int fd = memfd(), err, err2;
	rs_zip z, z2;

	/* Alone: the file is exactly the zip. */
	RS_FUZZ_CHECK(ftruncate(fd, 0) == 0);
	put(fd, data, size, 0);
	err = rs_zip_open(&z, fd, 0, size, msg, sizeof(msg));
	RS_FUZZ_CHECK(err == 0 || err == -EINVAL || err == -ENOMEM);
	/* Every refusal is the zip reader's own line, or names torch.save's
	 * pre-zip format (formats/codec/torchzip.h). */
	RS_FUZZ_CHECK(err == 0 || strncmp(msg, "zip: ", 5) == 0 ||
		      strncmp(msg, "a torch.save file in the legacy format", 38) == 0);
	RS_FUZZ_CHECK(strlen(msg) < sizeof(msg));
	if (!err)
		check_entries(&z, fd, 0, size);

	/* Embedded: garbage before and after, offsets relative to the zip. */
	RS_FUZZ_CHECK(ftruncate(fd, 0) == 0);
	put(fd, junk, PREFIX, 0);
	put(fd, data, size, PREFIX);
	put(fd, junk + PREFIX, SUFFIX, (off_t)(PREFIX + size));
	err2 = rs_zip_open(&z2, fd, PREFIX, size, msg2, sizeof(msg2));
	if (err != -ENOMEM && err2 != -ENOMEM) {
		RS_FUZZ_CHECK(err == err2);
		RS_FUZZ_CHECK(strcmp(msg, msg2) == 0);
	}
	if (!err && !err2) {
		RS_FUZZ_CHECK(same(&z, &z2));
		check_entries(&z2, fd, PREFIX, size);
	}
	rs_zip_free(&z);
	rs_zip_free(&z2);
	/* Free twice is safe, as the header promises. */
	rs_zip_free(&z);
	return 0;
}
