/* Snapshots (fs/snapshot.h) without a mount: files of every segment
 * kind (segments across window boundaries, a window of zeros only) built
 * and compared with bytes computed here, unwritable once built; reuse, single
 * flight, the shared budget (-ENOSPC while open files hold it, reclaim of
 * idle snapshots), -E2BIG, a source changed before a build (-ESTALE,
 * nothing kept), a dropped snapshot, and a file built in parts by build
 * threads (right bytes, no block built twice, -ESTALE as a whole).
 *
 * Run plain, it takes the huge-page tmpfs wherever it holds CAP_SYS_ADMIN
 * (as root); run as `test_snapshot memfd` it first drops CAP_SYS_ADMIN
 * from its effective set, so the store falls back to sealed memfds, as
 * for a daemon without the capability; `test_snapshot small` asks for
 * memfds (-o snapshot_pages=small), and `test_snapshot auto` for what
 * this machine gets by default.  Every run also checks how a virtio
 * balloon's feature bits are read (fs/huge_tmpfs.h) on made-up sysfs
 * folders.
 *
 * The source holds one f32 tensor of ROWS x COLS in C order (element g has
 * the bits g * 2654435761, so every element differs), stored as two row
 * chunks one after the other. */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "fs/huge_tmpfs.h"
#include "fs/snapshot.h"
#include "planner/catalog.h"
#include "planner/plan.h"
#include "tests/unit/check.h"
#include "tests/unit/source_file.h"

#define ROWS 2048u
#define COLS 1024u
#define MiB (1ull << 20)
#define COL0 512u
#define NCOLS 768u      /* 256 columns past the tensor: zeros */

static char dir[64];

static uint32_t bits(uint64_t g)
{
	return (uint32_t)(g * 2654435761u);
}

static uint8_t *make_content(void)
{
	uint8_t *p = malloc((size_t)ROWS * COLS * 4);

	for (uint64_t g = 0; p && g < (uint64_t)ROWS * COLS; g++) {
		uint32_t v = bits(g);

		memcpy(p + g * 4, &v, 4);
	}
	return p;
}

/* Element e of the column shard [0, ROWS) x [COL0, COL0 + NCOLS). */
static uint32_t want_col(uint64_t e)
{
	uint64_t row = e / NCOLS, col = COL0 + e % NCOLS;

	return col < COLS ? bits(row * COLS + col) : 0;
}

typedef struct {
	rs_blocks b;
	rs_vtree tree;
	rs_catalog cat;
	const rs_chunk *cols;     /* the column shard: 6 MiB */
	uint32_t a, b_file, c_file, d, big, huge;
	uint8_t *want_a, *want_b, *want_c, *want_d;
	uint64_t size_a, size_b, size_d;
} fixture;

static const char head[] = "a literal header";
static const char tail[] = "and its tail";

static void put_u32s(uint8_t *dst, uint64_t first, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		uint32_t v = want_col(first + i);

		memcpy(dst + i * 4, &v, 4);
	}
}

/* File a: literal, 5000 zeros, source bytes [4096, 4096 + 3 MiB), the
 * whole column shard, literal.  File b: bytes [1 MiB + 64, 5 MiB) of the
 * column shard (not on a block boundary).  c: the whole shard from the
 * file's start (its blocks built in place in the windows).  d: 19 MiB,
 * built in two parts cut inside the column shard (which does not start
 * on a block boundary): a literal, the whole tensor, 3 MiB of source
 * bytes, the column shard, 2 MiB of zeros.  big: 20 MiB of zeros; huge:
 * 40 MiB of zeros (over max_size). */
static void make_tree(fixture *f)
{
	const uint64_t shape[2] = { ROWS, COLS }, chunk[2] = { ROWS / 2, COLS };
	rs_box box = { .ndim = 2, .off = { 0, COL0 }, .len = { ROWS, NCOLS } };
	rs_box all = { .ndim = 2, .off = { 0, 0 }, .len = { ROWS, COLS } };
	const rs_chunk *whole;
	struct timespec ts = { 0 };
	uint8_t *content = make_content();
	rs_tensor *t;
	rs_plan plan;
	size_t ti;
	uint64_t at;

	rs_catalog_init(&f->cat);
	CHECK(rs_catalog_add_regular(&f->cat, "t", RS_DTYPE_F32, 2, shape,
				     chunk, &ti) == 0);
	t = &f->cat.tensors[ti];
	for (uint64_t r = 0; r < 2; r++) {
		const uint64_t idx[2] = { r, 0 };

		rs_catalog_set_chunk(t, idx, 0, r * (ROWS / 2) * COLS * 4);
	}
	CHECK(rs_plan_box(t, &box, box.len, &plan) == 0);
	CHECK(rs_vtree_init(&f->tree, ts) == 0);
	CHECK(rs_vtree_add_chunk(&f->tree, &plan, RS_DTYPE_F32, RS_DTYPE_F32,
				 &f->cols) == 0);
	CHECK(f->cols->size == 6 * MiB);
	CHECK(rs_plan_box(t, &all, all.len, &plan) == 0);
	CHECK(rs_vtree_add_chunk(&f->tree, &plan, RS_DTYPE_F32, RS_DTYPE_F32,
				 &whole) == 0);

	CHECK(rs_vtree_add_file(&f->tree, 0, "a", ts, &f->a) == 0);
	CHECK(rs_vtree_append_literal(&f->tree, f->a, head, sizeof(head)) == 0);
	CHECK(rs_vtree_append_zero(&f->tree, f->a, 5000) == 0);
	CHECK(rs_vtree_append_source(&f->tree, f->a, 0, 4096, 3 * MiB) == 0);
	CHECK(rs_vtree_append_tensor(&f->tree, f->a, f->cols, 0,
				     f->cols->size) == 0);
	CHECK(rs_vtree_append_literal(&f->tree, f->a, tail, sizeof(tail)) == 0);
	f->size_a = sizeof(head) + 5000 + 3 * MiB + 6 * MiB + sizeof(tail);
	f->want_a = calloc(1, f->size_a);
	memcpy(f->want_a, head, sizeof(head));
	at = sizeof(head) + 5000;
	memcpy(f->want_a + at, content + 4096, 3 * MiB);
	at += 3 * MiB;
	put_u32s(f->want_a + at, 0, 6 * MiB / 4);
	at += 6 * MiB;
	memcpy(f->want_a + at, tail, sizeof(tail));

	CHECK(rs_vtree_add_file(&f->tree, 0, "b", ts, &f->b_file) == 0);
	CHECK(rs_vtree_append_tensor(&f->tree, f->b_file, f->cols, MiB + 64,
				     4 * MiB - 64) == 0);
	f->size_b = 4 * MiB - 64;
	f->want_b = malloc(f->size_b);
	put_u32s(f->want_b, (MiB + 64) / 4, f->size_b / 4);

	CHECK(rs_vtree_add_file(&f->tree, 0, "c", ts, &f->c_file) == 0);
	CHECK(rs_vtree_append_tensor(&f->tree, f->c_file, f->cols, 0,
				     f->cols->size) == 0);
	f->want_c = malloc(6 * MiB);
	put_u32s(f->want_c, 0, 6 * MiB / 4);

	CHECK(rs_vtree_add_file(&f->tree, 0, "d", ts, &f->d) == 0);
	CHECK(rs_vtree_append_literal(&f->tree, f->d, head, sizeof(head)) == 0);
	CHECK(rs_vtree_append_tensor(&f->tree, f->d, whole, 0, whole->size) == 0);
	CHECK(rs_vtree_append_source(&f->tree, f->d, 0, 64, 3 * MiB) == 0);
	CHECK(rs_vtree_append_tensor(&f->tree, f->d, f->cols, 0,
				     f->cols->size) == 0);
	CHECK(rs_vtree_append_zero(&f->tree, f->d, 2 * MiB) == 0);
	f->size_d = sizeof(head) + 8 * MiB + 3 * MiB + 6 * MiB + 2 * MiB;
	f->want_d = calloc(1, f->size_d);
	memcpy(f->want_d, head, sizeof(head));
	at = sizeof(head);
	memcpy(f->want_d + at, content, 8 * MiB);
	memcpy(f->want_d + at + 8 * MiB, content + 64, 3 * MiB);
	put_u32s(f->want_d + at + 11 * MiB, 0, 6 * MiB / 4);

	CHECK(rs_vtree_add_file(&f->tree, 0, "big", ts, &f->big) == 0);
	CHECK(rs_vtree_append_zero(&f->tree, f->big, 20 * MiB) == 0);
	CHECK(rs_vtree_add_file(&f->tree, 0, "huge", ts, &f->huge) == 0);
	CHECK(rs_vtree_append_zero(&f->tree, f->huge, 40 * MiB) == 0);
	free(content);
}

static bool holds(const rs_snapshot *s, const uint8_t *want, uint64_t len)
{
	uint8_t *got = malloc(len + 1);
	bool ok = got && rs_snapshot_size(s) == len &&
		  pread(rs_snapshot_fd(s), got, len + 1, 0) == (ssize_t)len &&
		  memcmp(got, want, len) == 0;

	free(got);
	return ok;
}

/* CAP_SYS_ADMIN in the effective set: (set) whether it is, or (drop)
 * take it out. */
static bool sys_admin(bool drop)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	uint32_t bit = 1u << (CAP_SYS_ADMIN % 32);

	if (syscall(SYS_capget, &h, d) != 0)
		return false;
	if (drop) {
		d[CAP_SYS_ADMIN / 32].effective &= ~bit;
		CHECK(syscall(SYS_capset, &h, d) == 0);
	}
	return d[CAP_SYS_ADMIN / 32].effective & bit;
}

/* rs_free_page_reporting on a made-up driver folder: no folder, no
 * device, devices without and with bit 5 (free page reporting), a short
 * string, and a features file that is not a bit string. */
static void check_balloon_features(void)
{
	static const struct {
		const char *features;   /* NULL: no device */
		int want;
	} cases[] = {
		{ NULL, 0 },
		{ "0110000000000000000000000000000010000000\n", 0 },
		{ "0110010100000000000000000000000010000000\n", 1 },
		{ "01100\n", 0 },
		{ "011001x\n", -EINVAL },
	};
	char drv[96], path[160];
	FILE *f;

	CHECK(rs_free_page_reporting("/nonexistent/virtio_balloon") == 0);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(drv, sizeof(drv), "%s/balloon%zu", dir, i);
		CHECK(mkdir(drv, 0700) == 0);
		snprintf(path, sizeof(path), "%s/uevent", drv);
		f = fopen(path, "w");
		CHECK(f && fputs("DRIVER=virtio_balloon\n", f) >= 0 &&
		      fclose(f) == 0);
		if (cases[i].features) {
			snprintf(path, sizeof(path), "%s/virtio3", drv);
			CHECK(mkdir(path, 0700) == 0);
			snprintf(path, sizeof(path), "%s/virtio3/features", drv);
			f = fopen(path, "w");
			CHECK(f && fputs(cases[i].features, f) >= 0 &&
			      fclose(f) == 0);
		}
		CHECK(rs_free_page_reporting(drv) == cases[i].want);
		snprintf(path, sizeof(path), "%s/virtio3/features", drv);
		unlink(path);
		snprintf(path, sizeof(path), "%s/virtio3", drv);
		rmdir(path);
		snprintf(path, sizeof(path), "%s/uevent", drv);
		unlink(path);
		CHECK(rmdir(drv) == 0);
	}
}

/* Nobody, the daemon included, can write, grow or shrink it: a memfd
 * sealed, or a huge-page tmpfs file held only read-only. */
static void check_unwritable(const rs_snapshot *s, bool huge)
{
	int fd = rs_snapshot_fd(s);
	struct statfs fs;

	CHECK(fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC);
	if (huge) {
		CHECK((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY);
		CHECK(pwrite(fd, "x", 1, 0) < 0 && errno == EBADF);
		CHECK(ftruncate(fd, 1) < 0 &&
		      (errno == EBADF || errno == EINVAL));
	} else {
		int seals = fcntl(fd, F_GET_SEALS);

		CHECK(seals >= 0 && (seals & F_SEAL_WRITE) &&
		      (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW) &&
		      (seals & F_SEAL_SEAL));
		CHECK(pwrite(fd, "x", 1, 0) < 0 && errno == EPERM);
		CHECK(ftruncate(fd, 1) < 0 && errno == EPERM);
	}
}

typedef struct {
	fixture *f;
	rs_snapshots *s;
	rs_snapshot *got;
	int err;
} getter;

static void *get_b(void *arg)
{
	getter *g = arg;

	g->err = rs_snapshots_get(g->s, g->f->b_file, &g->got, NULL);
	return NULL;
}

int main(int argc, char **argv)
{
	rs_executor_opts eo = { .kind = RS_EXECUTOR_CPU, .threads = 2 };
	fixture f = { .b = { .root_path = dir } };
	uint8_t *content = make_content();
	rs_snapshots *s;
	rs_snapshot *a, *b, *big, *x;
	rs_snapshot_stats st;
	rs_cache_stats cs;
	getter g[4];
	pthread_t th[4];
	bool reused;
	char path[80];
	FILE *fp;

	/* The store takes the huge-page tmpfs exactly when asked (auto: where
	 * no balloon reports free pages) and it may mount. */
	const char *mode = argc > 1 ? argv[1] : "";
	rs_snapshot_pages pages = strcmp(mode, "small") == 0 ? RS_PAGES_SMALL
				: strcmp(mode, "auto") == 0 ? RS_PAGES_AUTO
				: RS_PAGES_HUGE;
	bool huge = sys_admin(strcmp(mode, "memfd") == 0) &&
		    pages != RS_PAGES_SMALL &&
		    !(pages == RS_PAGES_AUTO &&
		      rs_free_page_reporting(RS_BALLOON_DRIVER_DIR) != 0);

	snprintf(dir, sizeof(dir), "/tmp/rs_snapshot_XXXXXX");
	CHECK(content && mkdtemp(dir) != NULL);
	if (check_failed)
		return CHECK_DONE();
	f.b.sources = rs_test_source(dir, "src", content, (size_t)ROWS * COLS * 4);
	free(content);
	CHECK(rs_executor_create(&f.b.exec, &eo, NULL) == 0);
	CHECK(rs_cache_new(&f.b.cache, 32 * MiB, false) == 0);
	make_tree(&f);
	check_balloon_features();
	CHECK(rs_snapshots_new(&s, &f.b, &f.tree, 24 * MiB, pages) == 0);
	CHECK(rs_snapshots_start(s, 2) == 0);
	if (check_failed)
		return CHECK_DONE();

	/* Every segment kind, built and sealed; a second get reuses it. */
	CHECK(rs_snapshots_get(s, f.a, &a, &reused) == 0 && !reused);
	CHECK(holds(a, f.want_a, f.size_a));
	check_unwritable(a, huge);
	CHECK(rs_snapshots_get(s, f.a, &x, &reused) == 0 && reused && x == a);
	rs_snapshots_release(s, x);
	rs_snapshots_get_stats(s, &st);
	CHECK(st.builds == 1 && st.reuses == 1 && st.files == 1 &&
	      st.bytes == f.size_a && st.bytes_built == f.size_a &&
	      st.huge_pages == huge && (st.small_because[0] == 0) == huge);
	CHECK(rs_sources_bytes_read(f.b.sources) >= 3 * MiB);

	CHECK(rs_snapshots_get(s, f.c_file, &x, NULL) == 0);
	CHECK(holds(x, f.want_c, 6 * MiB));
	rs_snapshots_release(s, x);
	rs_snapshots_drop(s, f.c_file);

	/* Single flight: four threads, one build of b. */
	for (int i = 0; i < 4; i++) {
		g[i] = (getter){ &f, s, NULL, -1 };
		CHECK(pthread_create(&th[i], NULL, get_b, &g[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		CHECK(g[i].err == 0 && g[i].got == g[0].got);
	}
	b = g[0].got;
	CHECK(holds(b, f.want_b, f.size_b));
	rs_snapshots_get_stats(s, &st);
	CHECK(st.builds == 3 && st.reuses == 4);
	for (int i = 1; i < 4; i++)
		rs_snapshots_release(s, g[i].got);

	/* The budget: a (12 MiB) and b (4 MiB) are held; big (20 MiB) does
	 * not fit beside them and is not kept; huge is over max_size. */
	CHECK(rs_snapshots_get(s, f.big, &big, NULL) == -ENOSPC);
	CHECK(rs_snapshots_get(s, f.huge, &x, NULL) == -E2BIG);
	rs_cache_get_stats(f.b.cache, &cs);
	CHECK(cs.charged == f.size_a + f.size_b);
	/* a idle: reclaimed for big. */
	rs_snapshots_release(s, a);
	CHECK(rs_snapshots_get(s, f.big, &big, NULL) == 0);
	rs_snapshots_get_stats(s, &st);
	CHECK(st.evictions == 1 && st.files == 2);
	rs_cache_get_stats(f.b.cache, &cs);
	CHECK(cs.charged == f.size_b + 20 * MiB && cs.charged <= 32 * MiB);
	/* Windows of zeros only are holes: the 20 MiB read back as zeros and
	 * take no memory. */
	{
		uint8_t *z = calloc(1, 20 * MiB);
		struct stat sb;

		CHECK(z && holds(big, z, 20 * MiB));
		CHECK(fstat(rs_snapshot_fd(big), &sb) == 0 && sb.st_blocks == 0);
		free(z);
	}
	rs_snapshots_release(s, big);

	/* drop: an idle snapshot goes, a held one stays. */
	rs_snapshots_drop(s, f.big);
	rs_snapshots_drop(s, f.b_file);
	rs_snapshots_get_stats(s, &st);
	CHECK(st.files == 1);
	rs_snapshots_release(s, b);

	/* A file in parts, built by this thread and the build threads: every
	 * byte right, and no block built by both parts (the source bytes read
	 * are the tensor's 8 MiB, the 3 MiB range and the shard's 4 MiB of
	 * stored columns). */
	{
		uint64_t before = rs_sources_bytes_read(f.b.sources), parts;

		rs_snapshots_get_stats(s, &st);
		parts = st.parts;
		CHECK(rs_snapshots_get(s, f.d, &x, NULL) == 0);
		CHECK(holds(x, f.want_d, f.size_d));
		check_unwritable(x, huge);
		CHECK(rs_sources_bytes_read(f.b.sources) - before ==
		      8 * MiB + 3 * MiB + 4 * MiB);
		rs_snapshots_get_stats(s, &st);
		CHECK(st.parts - parts == 2 && st.build_threads == 2);
		rs_snapshots_release(s, x);
		rs_snapshots_drop(s, f.d);
	}

	/* The source changed: a build fails with -ESTALE and keeps nothing. */
	snprintf(path, sizeof(path), "%s/src", dir);
	fp = fopen(path, "ab");
	CHECK(fp && fputc('x', fp) == 'x');
	if (fp)
		fclose(fp);
	rs_snapshots_drop(s, f.b_file);
	rs_cache_get_stats(f.b.cache, &cs);
	CHECK(rs_snapshots_get(s, f.a, &x, NULL) == -ESTALE);
	/* and a build in parts fails whole, whichever part found it */
	CHECK(rs_snapshots_get(s, f.d, &x, NULL) == -ESTALE);
	rs_snapshots_get_stats(s, &st);
	CHECK(st.files == 0 && st.build_errors == 2);
	{
		rs_cache_stats after;

		rs_cache_get_stats(f.b.cache, &after);
		CHECK(after.charged == 0 && cs.charged == 0);
	}

	rs_snapshots_free(s);
	rs_vtree_free(&f.tree);
	rs_catalog_free(&f.cat);
	free(f.want_a);
	free(f.want_b);
	free(f.want_d);
	free(f.want_c);
	rs_cache_free(f.b.cache);
	rs_executor_destroy(f.b.exec);
	rs_sources_free(f.b.sources);
	unlink(path);
	rmdir(dir);
	return CHECK_DONE();
}
