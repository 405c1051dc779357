/* fuzz_torch_dist_meta: a DCP `.metadata` (and the .distcp files it points into).
 *
 * Input: the .metadata pickle, optionally followed by MARKER and the bytes
 * of __0_0.distcp, and by MARKER and those of __1_0.distcp.  The files are
 * written to a private directory on tmpfs and stand as SOURCE's root
 * entries, as rs_torch_dist_read's walk would have left them; then
 * rs_torch_dist_read_metadata turns the pickle into catalog tensors and blobs.
 *
 * A refusal must come with lines naming .metadata or a file of SOURCE.  An
 * accepted checkpoint must keep the catalog's promises the views and the
 * read path build on: fragments inside their tensor and not overlapping
 * each other, a regular grid that really is one, every element of every
 * fragment (and every byte of every blob) inside its source file, and every
 * copy op planned from a fragment reading inside the file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/checkpoint.h"
#include "formats/torch_dist/torch_dist.h"
#include "planner/plan.h"
#include "tests/fuzz/fuzz.h"

#define MARKER "\nRSFUZZ-DISTCP\n"
#define MARKER_LEN (sizeof(MARKER) - 1)
#define NFILES 2

static const char *const file_names[NFILES] = { "__0_0.distcp",
						"__1_0.distcp" };
static char root[64];

static void remove_root(void)
{
	char path[128];

	for (int i = 0; i < NFILES; i++) {
		snprintf(path, sizeof(path), "%s/%s", root, file_names[i]);
		unlink(path);
	}
	rmdir(root);
}

static void make_root(void)
{
	if (root[0])
		return;
	/* tmpfs when there is one: each input rewrites the files.  Removed
	 * at exit; a crash leaves it (two files of at most max_len bytes). */
	strcpy(root, "/dev/shm/rs_fuzz_torch_dist.XXXXXX");
	if (!mkdtemp(root)) {
		strcpy(root, "/tmp/rs_fuzz_torch_dist.XXXXXX");
		RS_FUZZ_CHECK(mkdtemp(root));
	}
	atexit(remove_root);
}

/* Writes file i with bytes p[0, n) and records it as a root entry. */
static void add_file(rs_checkpoint *ck, int i, const uint8_t *p, size_t n)
{
	char path[128];
	struct stat st;
	rs_file_id id;
	rs_entry *e;
	uint32_t src;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", root, file_names[i]);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	RS_FUZZ_CHECK(fd >= 0);
	RS_FUZZ_CHECK(write(fd, p, n) == (ssize_t)n);
	RS_FUZZ_CHECK(fstat(fd, &st) == 0);
	close(fd);
	rs_file_id_from_stat(&id, &st);
	RS_FUZZ_CHECK(rs_sources_add(ck->sources, file_names[i], &id, &src) == 0);
	e = &ck->entries[ck->nentries++];
	*e = (rs_entry){ .name = strdup(file_names[i]), .parent = -1,
			 .source = src, .mtime = st.st_mtim };
	RS_FUZZ_CHECK(e->name);
}

static uint64_t file_size(const rs_checkpoint *ck, uint32_t source)
{
	RS_FUZZ_CHECK(source < rs_sources_count(ck->sources));
	return rs_sources_id(ck->sources, source)->size;
}

static bool boxes_overlap(const rs_box *a, const rs_box *b)
{
	rs_box in;

	return rs_box_intersect(a, b, &in);
}

/* Bytes [offset, end) a fragment's elements span in its source. */
static void check_fragment(const rs_checkpoint *ck, const rs_tensor *t,
			   const rs_fragment *f)
{
	uint64_t e = rs_dtype_size(t->dtype), last = 0, end;

	RS_FUZZ_CHECK(f->box.ndim == t->ndim);
	for (int i = 0; i < t->ndim; i++) {
		RS_FUZZ_CHECK(f->box.off[i] <= t->shape[i] &&
			      f->box.len[i] <= t->shape[i] - f->box.off[i]);
		if (f->box.len[i] == 0)
			return; /* no elements */
		last += (f->box.len[i] - 1) * f->stride[i];
	}
	end = f->offset + (last + 1) * e;
	RS_FUZZ_CHECK(end <= file_size(ck, f->source));
}

/* A plan of each small fragment box reads inside the source file. */
static void check_plans(const rs_checkpoint *ck, const rs_tensor *t)
{
	for (size_t k = 0; k < t->nfrags && k < 64; k++) {
		const rs_box *box = &t->frags[k].box;
		uint64_t n;
		rs_plan p;

		if (!rs_product(box->len, t->ndim, &n) || n > (1u << 16))
			continue;
		if (rs_plan_box(t, box, box->len, &p) != 0)
			continue;
		RS_FUZZ_CHECK(p.covered <= p.size);
		for (size_t j = 0; j < p.count; j++) {
			const rs_copy_op *op = &p.ops[j];
			uint64_t size = file_size(ck, op->source);

			RS_FUZZ_CHECK(op->count >= 1);
			RS_FUZZ_CHECK(op->src_off + (op->count - 1) * op->src_stride +
					      op->len <= size);
			RS_FUZZ_CHECK(op->dst_off + (op->count - 1) * op->dst_stride +
					      op->len <= p.size);
		}
		rs_plan_free(&p);
	}
}

static void check_tensor(const rs_checkpoint *ck, const rs_tensor *t)
{
	RS_FUZZ_CHECK(t->ndim >= 0 && t->ndim <= RS_MAX_DIMS);
	RS_FUZZ_CHECK(rs_dtype_size(t->dtype) > 0);
	for (size_t k = 0; k < t->nfrags; k++)
		check_fragment(ck, t, &t->frags[k]);
	/* Fragments never overlap (catalog.h): a plan relies on it. */
	for (size_t a = 0; a < t->nfrags && a < 256; a++)
		for (size_t b = a + 1; b < t->nfrags && b < 256; b++)
			RS_FUZZ_CHECK(!boxes_overlap(&t->frags[a].box,
						     &t->frags[b].box) ||
				      t->ndim == 0);
	if (t->regular) {
		uint64_t cells = 1;

		for (int i = 0; i < t->ndim; i++) {
			RS_FUZZ_CHECK(t->grid[i] > 0);
			cells *= t->grid_count[i];
		}
		RS_FUZZ_CHECK(cells == t->nfrags);
		for (size_t k = 0; k < t->nfrags; k++) {
			uint64_t idx[RS_MAX_DIMS];
			rs_box cell;

			rs_grid_coords(k, t->grid_count, t->ndim, idx);
			rs_grid_cell(idx, t->grid, t->shape, t->ndim, &cell);
			RS_FUZZ_CHECK(memcmp(cell.off, t->frags[k].box.off,
					     (size_t)t->ndim * 8) == 0 &&
				      memcmp(cell.len, t->frags[k].box.len,
					     (size_t)t->ndim * 8) == 0);
		}
	}
	check_plans(ck, t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *part[1 + NFILES] = { data };
	size_t len[1 + NFILES] = { size };
	int nparts = 1, err;
	rs_checkpoint ck;
	rs_diag *d;

	make_root();
	/* Split at the markers: .metadata, then each file's bytes. */
	while (nparts < 1 + NFILES) {
		const uint8_t *m = memmem(part[nparts - 1], len[nparts - 1],
					  MARKER, MARKER_LEN);

		if (!m)
			break;
		part[nparts] = m + MARKER_LEN;
		len[nparts] = len[nparts - 1] - (size_t)(part[nparts] - part[nparts - 1]);
		len[nparts - 1] = (size_t)(m - part[nparts - 1]);
		nparts++;
	}

	d = rs_diag_new();
	RS_FUZZ_CHECK(d && rs_checkpoint_init(&ck, root, d) == 0);
	ck.format = &rs_torch_dist_format;
	ck.entries = calloc(NFILES, sizeof(rs_entry));
	ck.cap_entries = NFILES;
	RS_FUZZ_CHECK(ck.entries);
	for (int i = 0; i < NFILES; i++)
		add_file(&ck, i, i + 1 < nparts ? part[i + 1] : NULL,
			 i + 1 < nparts ? len[i + 1] : 0);

	err = rs_torch_dist_read_metadata(&ck, part[0], len[0], d);
	RS_FUZZ_CHECK(err == 0 || err == -EINVAL || err == -ENOMEM ||
		      err == -E2BIG);
	rs_fuzz_check_diag(d, err, root);
	if (!err) {
		for (size_t i = 0; i < ck.catalog.count; i++)
			check_tensor(&ck, &ck.catalog.tensors[i]);
		for (size_t i = 0; i < ck.nblobs; i++) {
			const rs_blob *b = &ck.blobs[i];

			RS_FUZZ_CHECK(b->fqn);
			RS_FUZZ_CHECK(b->offset <= file_size(&ck, b->source) &&
				      b->length <= file_size(&ck, b->source) - b->offset);
		}
	}
	rs_diag_free(d);
	rs_checkpoint_close(&ck);
	return 0;
}
