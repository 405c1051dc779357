/* The key forms of megatron-core's expert modules in legacy rank files
 * (formats/megatron/megatron_int.h, rs_meg_expert_key and
 * rs_meg_expert_suffix): each form parsed, written back the same, and
 * names that only look like expert keys left alone. */
#include <errno.h>
#include <string.h>

#include "formats/megatron/megatron_int.h"
#include "tests/unit/check.h"

static int param_index(const char *param)
{
	for (size_t k = 0; k < rs_meg_expert_nparams; k++)
		if (strcmp(rs_meg_expert_params[k].param, param) == 0)
			return (int)k;
	return -1;
}

static void parses(const char *key, rs_meg_experts form, const char *param,
		   long local, size_t at)
{
	rs_meg_experts f = RS_MEG_EXPERTS_NONE;
	int p = -1;
	long l = -7;
	size_t a = 0;
	char back[128];

	CHECK(rs_meg_expert_key(key, &f, &p, &l, &a));
	CHECK(f == form);
	CHECK(p == param_index(param));
	CHECK(l == local);
	CHECK(a == at);
	/* written back in its own form: the same key */
	if (p >= 0) {
		CHECK(rs_meg_expert_suffix(f, p, local < 0 ? 0 : (uint64_t)local,
					   back, sizeof(back)) == 0);
		CHECK(strcmp(back, key + a) == 0);
	}
}

static void not_expert(const char *key)
{
	rs_meg_experts f;
	int p;
	long l;
	size_t a;

	CHECK(!rs_meg_expert_key(key, &f, &p, &l, &a));
}

int main(void)
{
	parses("mlp.experts.local_experts.5.linear_fc1.weight",
	       RS_MEG_EXPERTS_SEQUENTIAL, "linear_fc1.weight", 5, 12);
	parses("decoder.layers.mlp.experts.local_experts.12.linear_fc2.weight",
	       RS_MEG_EXPERTS_SEQUENTIAL, "linear_fc2.weight", 12, 27);
	parses("mlp.experts.linear_fc1.weight0", RS_MEG_EXPERTS_TE,
	       "linear_fc1.weight", 0, 12);
	parses("mlp.experts.linear_fc2.bias31", RS_MEG_EXPERTS_TE,
	       "linear_fc2.bias", 31, 12);
	parses("mlp.experts.weight1", RS_MEG_EXPERTS_GROUPED,
	       "linear_fc1.weight", -1, 12);
	parses("mlp.experts.weight2", RS_MEG_EXPERTS_GROUPED,
	       "linear_fc2.weight", -1, 12);

	not_expert("mlp.linear_fc1.weight");
	not_expert("mlp.shared_experts.linear_fc1.weight");
	not_expert("mlp.router.weight");
	not_expert("mlp.experts.local_experts.5.linear_fc1._extra_state");
	not_expert("mlp.experts.linear_fc1._extra_state");
	not_expert("mlp.experts.linear_fc1.weight");          /* no index */
	not_expert("mlp.experts.local_experts..linear_fc1.weight");
	not_expert("mlp.experts.local_experts.-1.linear_fc1.weight");
	not_expert("mlp.experts.local_experts.1234567890.linear_fc1.weight");
	not_expert("mlp.experts.linear_fc1.weight1x");
	not_expert("mlp.experts.weight3");
	not_expert("xmlp.experts.weight1");                   /* not a key start */
	not_expert("mlp.local_experts.0.dense_h_to_4h.weight"); /* SwitchMLP */

	/* GroupedMLP has no bias matrices */
	{
		char out[64];

		CHECK(rs_meg_expert_suffix(RS_MEG_EXPERTS_GROUPED,
					   param_index("linear_fc1.bias"), 0, out,
					   sizeof(out)) == -EINVAL);
		CHECK(rs_meg_expert_suffix(RS_MEG_EXPERTS_SEQUENTIAL,
					   param_index("linear_fc1.weight"), 3,
					   out, 8) == -ENAMETOOLONG);
	}
	return CHECK_DONE();
}
