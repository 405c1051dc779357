/* fuzz_safetensors: a .safetensors file, through the whole reader.
 *
 * Input: the bytes of one file, written as `model.safetensors` into a
 * private directory on tmpfs; rs_checkpoint_open then detects and reads it
 * as any mount would.  A refusal must come with lines naming the
 * directory.  An accepted file must keep the catalog's promises: one
 * fragment per non-empty tensor, C-order, every element inside the file
 * and after the header; and its tp=1 safetensors view must build, each
 * tensor's plan reading inside the file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/open.h"
#include "formats/safetensors/safetensors.h"
#include "planner/plan.h"
#include "planner/rules.h"
#include "tests/fuzz/fuzz.h"

static char root[64], path[128];

static void remove_root(void)
{
	unlink(path);
	rmdir(root);
}

static void make_root(void)
{
	if (root[0])
		return;
	strcpy(root, "/dev/shm/rs_fuzz_st.XXXXXX");
	if (!mkdtemp(root)) {
		strcpy(root, "/tmp/rs_fuzz_st.XXXXXX");
		RS_FUZZ_CHECK(mkdtemp(root));
	}
	snprintf(path, sizeof(path), "%s/model.safetensors", root);
	atexit(remove_root);
}

static void check_tensor(const rs_checkpoint *ck, const rs_tensor *t,
			 uint64_t size)
{
	uint64_t numel = 1;

	RS_FUZZ_CHECK(t->regular && t->nfrags <= 1);
	for (int i = 0; i < t->ndim; i++)
		numel *= t->shape[i];
	RS_FUZZ_CHECK((numel == 0) == (t->nfrags == 0));
	if (t->nfrags) {
		const rs_fragment *f = &t->frags[0];

		RS_FUZZ_CHECK(f->offset >= 8);
		RS_FUZZ_CHECK(f->offset + numel * rs_dtype_size(t->dtype) <= size);
		RS_FUZZ_CHECK(rs_sources_id(ck->sources, f->source)->size == size);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	rs_checkpoint ck;
	rs_layout_opts lo = { 0 };
	rs_layout l;
	rs_rules *rules = NULL;
	rs_vtree t;
	rs_diag *d;
	int fd, err;

	make_root();
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	RS_FUZZ_CHECK(fd >= 0);
	RS_FUZZ_CHECK(write(fd, data, size) == (ssize_t)size);
	close(fd);
	d = rs_diag_new();
	err = rs_checkpoint_open(root, NULL, &ck, d);
	RS_FUZZ_CHECK(err == 0 || err == -EINVAL || err == -ENOMEM);
	rs_fuzz_check_diag(d, err, root);
	if (err) {
		rs_diag_free(d);
		return 0;
	}
	RS_FUZZ_CHECK(ck.format == &rs_safetensors_format);
	for (size_t i = 0; i < ck.catalog.count; i++)
		check_tensor(&ck, &ck.catalog.tensors[i], size);
	lo.tp = 1;
	RS_FUZZ_CHECK(rs_rules_new(&rules) == 0);
	if (rs_layout_resolve(&ck.catalog, rules, &lo, &l, d) == 0) {
		err = rs_checkpoint_build_view(&ck, &rs_safetensors_format, &l, &t, d);
		RS_FUZZ_CHECK(err == 0 || err == -EINVAL || err == -ENOMEM);
		if (!err) {
			uint32_t file;

			RS_FUZZ_CHECK(rs_vtree_lookup(&t, 0, "model.safetensors",
						      &file) == 0);
			/* Same tensors, same bytes: the view is no larger
			 * than the data plus a rewritten header. */
			RS_FUZZ_CHECK(t.nodes[file].size >= 8);
		}
		rs_vtree_free(&t);
		rs_layout_free(&l);
	}
	rs_rules_free(rules);
	rs_checkpoint_close(&ck);
	rs_diag_free(d);
	return 0;
}
