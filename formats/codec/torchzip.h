/* torchzip: the zip container torch.save writes
 * (docs/FORMATS.md, "torch.save").
 *
 * The same container is a `.pt` file, `common.pt`, a legacy per-rank
 * checkpoint, and every tensor item inside a `.distcp` (a whole zip at an
 * offset of the file, its own offsets relative to its first byte).
 *
 * Reader.  rs_zip_open parses the zip held in bytes [base, base+len) of a
 * descriptor with pread: the end records, the central directory and each
 * local header, never entry data.  Every byte is hostile: sizes are
 * uint64_t and overflow-checked; the end records must agree and sit where
 * they say; every entry must be STORED (method 0, compressed size ==
 * size), unencrypted, on disk 0, and lie wholly inside the range and
 * before the central directory; no two entries may overlap (as CPython
 * refuses since CVE-2024-0450); names are unique, at most RS_ZIP_MAX_NAME
 * bytes, and all under one archive prefix, "<archive>/<record>", the
 * prefix taken from the first entry as torch does.  Record names are
 * '/'-separated components, none empty, "." or "..", and no NUL, '\\' or
 * control character anywhere.  ZIP64 is understood (torch always writes
 * the ZIP64 end record and locator).  An entry's data offset is its local
 * header offset + 30 + name length + the LOCAL extra length, which differs
 * from the central one: torch pads data to 64 bytes with a local 'FB'
 * extra field.  CRCs are reported, not checked (that would read the data).
 * A `byteorder` record other than "little" is refused: torch.load would
 * byteswap such a file's tensors, so its bytes are not the values.
 *
 * Writer.  rs_zip_layout_build lays out a whole torch.save zip without any
 * data in hand: local headers with the 'FB' padding extra, flags 0x0808
 * and data descriptors, the central directory, and the ZIP64 end record,
 * locator and end record, byte for byte as torch's PyTorchStreamWriter
 * (miniz, ZIP64 mode, no timestamps) writes them, ZIP64 extra fields
 * included for entries of 4 GiB and more or past 4 GiB.  The result is a
 * list of pieces laid end to end: literal bytes (headers, trailers, and
 * the data of literal entries) and "data of entry i" for entries whose
 * bytes a provider serves later (tensor segments).  Every offset and size
 * is known up front.
 *
 * CRC.  Literal entries get their real CRC-32 (zlib).  A provider entry's
 * CRC is unknown at layout time: it is written as 0 and its `crc_at`
 * positions (the data descriptor and the central directory record, as zip
 * offsets inside literal pieces) say where rs_zip_patch_crc must write it.
 * With RS_ZIP_CRC_ZERO provider entries keep CRC 0 for good (torch.load
 * ignores CRCs; strict zip tools then fail the test of those entries).
 * torch writes a CRC of 0 in every local header, so nothing there.
 *
 * Errors: functions return 0 or a negative errno.  rs_zip_open reports a
 * malformed zip as -EINVAL with one line in `msg`, "zip: <what> (offset N)",
 * N relative to the zip's first byte; a failed pread gives its -errno and
 * a line too.  A file in torch.save's legacy (pre-1.6, non-zip) format is
 * -EINVAL with a line saying so and how to re-save it as a zip.  The
 * caller prefixes the file name.
 * Ownership: an rs_zip or rs_zip_layout owns everything it points to,
 * until its free function (safe on a zeroed or failed struct).
 */
#ifndef RS_TORCHZIP_H
#define RS_TORCHZIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Limits a torch.save zip is far below; anything past them is hostile. */
#define RS_ZIP_MAX_ENTRIES (1u << 20)
#define RS_ZIP_MAX_NAME 1024u
#define RS_ZIP_MAX_CD_BYTES (256u << 20)
/* Room for any message rs_zip_open writes. */
#define RS_ZIP_MSG_SIZE 320

/* torch's default alignment of entry data (storage_alignment). */
#define RS_ZIP_ALIGNMENT 64u

/* ---- Reader ---- */

typedef struct {
	const char *name;      /* "<archive>/<record>", NUL-terminated */
	const char *record;    /* the name past "<archive>/" */
	uint64_t header_offset;/* local header, from the zip's first byte */
	uint64_t offset;       /* data, from the zip's first byte */
	uint64_t size;         /* stored: compressed == uncompressed */
	uint32_t crc32;        /* as the central directory says */
} rs_zip_entry;

typedef struct {
	char *archive;          /* the prefix, without '/' */
	rs_zip_entry *entries;  /* central directory order (torch's write order) */
	size_t count;
	uint64_t cd_offset, cd_size;
	bool zip64;             /* a ZIP64 end record was present */
	/* private */
	char *names;
	size_t *by_name;        /* entry indices sorted by record name */
} rs_zip;

/* Parses the zip in [base, base+len) of fd.  On failure *z is left empty
 * (rs_zip_free is still safe) and msg (msg_size bytes, may be 0) says why. */
int rs_zip_open(rs_zip *z, int fd, uint64_t base, uint64_t len, char *msg,
		size_t msg_size);
void rs_zip_free(rs_zip *z);

/* A safe record name: '/'-separated components, none empty, "." or "..";
 * no '\\' or control characters.  The reader refuses others, and the
 * writer writes only these, so what it writes reads back. */
bool rs_zip_record_ok(const char *record);

/* The entry of a record ("data.pkl", "data/0"), or NULL. */
const rs_zip_entry *rs_zip_find(const rs_zip *z, const char *record);

/* ---- Writer ---- */

typedef struct {
	const char *record;     /* name under the archive prefix: "data/0" */
	const void *bytes;      /* literal data (copied), or NULL if provided */
	uint64_t size;
	bool provided;          /* bytes come later from a provider */
} rs_zip_input;

typedef enum {
	RS_ZIP_PIECE_LITERAL,
	RS_ZIP_PIECE_DATA,      /* the data of entries[entry] */
} rs_zip_piece_kind;

typedef struct {
	rs_zip_piece_kind kind;
	uint64_t offset;        /* in the zip */
	uint64_t length;
	const uint8_t *bytes;   /* LITERAL: into the layout, patched in place */
	size_t entry;           /* DATA */
} rs_zip_piece;

typedef struct {
	uint64_t header_offset, offset, size;
	uint32_t crc32;
	bool provided;
	bool crc_pending;       /* provided, not patched, not CRC_ZERO */
	int ncrc;               /* CRC fields to patch: 0 (size 0), or 2 */
	uint64_t crc_at[2];     /* zip offsets of those 4-byte fields */
	/* private */
	size_t crc_lit[2];      /* the same fields in the literal bytes */
} rs_zip_layout_entry;

typedef struct {
	rs_zip_layout_entry *entries;   /* in input order = zip order */
	size_t count;
	rs_zip_piece *pieces;
	size_t npieces;
	uint64_t size;                  /* the whole zip */
	/* private */
	uint8_t *lit;                   /* every literal byte, in zip order */
	size_t lit_len;
	uint64_t *lit_at;               /* per piece: offset in lit */
} rs_zip_layout;

enum {
	RS_ZIP_CRC_ZERO = 1u << 0,      /* provider CRCs stay 0 */
};

/* Lays out `archive` (a safe name: rs_name_is_safe) holding n entries in
 * the given order, data aligned to `alignment` (a power of two up to 32768;
 * 0 means RS_ZIP_ALIGNMENT).  -EINVAL for a bad name or argument, -EFBIG
 * when the zip would pass the limits of the format (or miniz's), -ENOMEM. */
int rs_zip_layout_build(rs_zip_layout *l, const char *archive,
			const rs_zip_input *in, size_t n, uint32_t alignment,
			unsigned flags);
void rs_zip_layout_free(rs_zip_layout *l);

/* Lays out a whole torch.save file as torch 2.x writes one, its records
 * in torch's order: data.pkl (the n_storages storages' pickle, copied),
 * .format_version, .storage_alignment, byteorder ("little"), the
 * storages data/0 .. data/<n-1> (provided later, sizes[k] bytes each),
 * version and .data/serialization_id.  Storage k is layout entry
 * RS_ZIP_TORCH_SAVE_STORAGE0 + k.  CRCs of the storages stay 0, as
 * torch.load does not check them.  Errors as rs_zip_layout_build. */
#define RS_ZIP_TORCH_SAVE_STORAGE0 4
int rs_zip_layout_torch_save(rs_zip_layout *l, const char *archive,
			     const void *pkl, size_t pkl_len,
			     const uint64_t *sizes, size_t n);

/* Writes crc into every CRC field of provided entry `entry`.  -EINVAL for
 * an entry that is not provided or out of range. */
int rs_zip_patch_crc(rs_zip_layout *l, size_t entry, uint32_t crc);

/* Provided entries whose CRC is still pending. */
size_t rs_zip_layout_pending(const rs_zip_layout *l);

#endif
