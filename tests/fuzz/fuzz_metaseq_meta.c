/* fuzz_metaseq_meta: a metaseq shard's data.pkl, through the parts of the
 * metaseq reader that walk it (formats/metaseq/meta.c).
 *
 * The input is the pickle.  It is parsed with the metaseq allowlist; the
 * top-level dict's "shard_metadata" (or the root itself, when it is no
 * such dict, so bare metadata is fuzzed too) goes to ms_meta_from_pickle.
 * A refusal must be lines naming the file; an accepted description must
 * keep its promises: every param has a name and a shape of at most
 * RS_MAX_DIMS sizes whose product is its numel, and a flat param's numels
 * add up to its total without overflow.  The top dict's cfg (or args) goes
 * to ms_cfg_read and ms_cfg_copy (formats/metaseq/cfg.c, interp.c): a
 * refusal is lines naming the file; an accepted model has positive
 * sizes, heads that divide the width.
 */
#include "formats/metaseq/metaseq_int.h"
#include "tests/fuzz/fuzz.h"

#define WHERE "fuzz/model_part-0-shard0.pt"

static void check_meta(const ms_meta *m)
{
	for (size_t f = 0; f < m->nflats; f++) {
		const ms_flat *fl = &m->flats[f];
		uint64_t sum = 0;

		RS_FUZZ_CHECK(fl->key && fl->prefix_len <= strlen(fl->key));
		for (size_t p = 0; p < fl->nparams; p++) {
			const ms_param *pa = &fl->params[p];
			uint64_t numel = 1;

			RS_FUZZ_CHECK(pa->name && *pa->name);
			RS_FUZZ_CHECK(pa->ndim >= 0 && pa->ndim <= RS_MAX_DIMS);
			for (int i = 0; i < pa->ndim; i++)
				RS_FUZZ_CHECK(rs_mul_u64(numel, pa->shape[i],
							 &numel));
			RS_FUZZ_CHECK(numel == pa->numel);
			RS_FUZZ_CHECK(rs_add_u64(sum, pa->numel, &sum));
		}
		RS_FUZZ_CHECK(sum == fl->total);
	}
	for (size_t b = 0; b < m->nbuffers; b++)
		RS_FUZZ_CHECK(m->buffers[b] != NULL);
}

static void check_cfg(const rs_pvalue *top)
{
	ms_state *st = calloc(1, sizeof(*st));
	rs_diag *d = rs_diag_new();
	ms_cfg c;
	int err;

	RS_FUZZ_CHECK(st && d);
	err = ms_cfg_read(top, WHERE, &c, d);
	rs_fuzz_check_diag(d, err, WHERE);
	if (!err && c.present) {
		RS_FUZZ_CHECK(c.m.layers && c.m.hidden && c.m.ffn && c.m.heads);
		RS_FUZZ_CHECK(c.m.source_tp && c.m.hidden % c.m.heads == 0);
		RS_FUZZ_CHECK(c.m.position_rows == c.m.max_positions + 2);
	}
	err = ms_cfg_copy(top, st);
	RS_FUZZ_CHECK(err == 0 || err == -ENOMEM);
	for (size_t i = 0; i < st->ncfg; i++)
		RS_FUZZ_CHECK(st->cfg[i].key && *st->cfg[i].key);
	ms_state_free(st);
	rs_diag_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const rs_pvalue *top, *sm;
	rs_pickle_limits lim;
	rs_pickle *pk = NULL;
	ms_meta m = { 0 };
	char err_line[200];
	rs_diag *d;
	int err;

	rs_pickle_limits_default(&lim);
	lim.allow = ms_pickle_allow;
	if (rs_pickle_parse(data, size, &lim, &pk, err_line,
			    sizeof(err_line)) != 0)
		return 0;
	d = rs_diag_new();
	RS_FUZZ_CHECK(d);
	sm = rs_pickle_root(pk);
	if (ms_dict(sm, &top) && rs_pv_get(top, "shard_metadata"))
		sm = rs_pv_get(top, "shard_metadata");
	err = ms_meta_from_pickle(sm, WHERE, &m, d);
	rs_fuzz_check_diag(d, err, WHERE);
	if (!err)
		check_meta(&m);
	ms_meta_free(&m);
	rs_diag_free(d);
	if (ms_dict(rs_pickle_root(pk), &top))
		check_cfg(top);
	rs_pickle_free(pk);
	return 0;
}
