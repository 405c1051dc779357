/* Legacy Megatron: the key forms of megatron-core's expert modules
 * (megatron_int.h, rs_meg_experts).
 *
 * In a rank file each EP rank numbers its experts from 0; the reader
 * turns global expert e*L + i (L experts per EP rank) into one slice of
 * the catalog tensor's expert axis, and the view back.
 */
#include "formats/megatron/megatron_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* fc1 is split by its rows (column parallel), fc2 by its columns (row
 * parallel), each within its expert: axes of (experts, out, in). */
const rs_meg_expert_param rs_meg_expert_params[] = {
	{ "linear_fc1.weight", "weight1", 1, true },
	{ "linear_fc2.weight", "weight2", 2, false },
	{ "linear_fc1.bias", NULL, 1, true },
	{ "linear_fc2.bias", NULL, -1, false },
};
const size_t rs_meg_expert_nparams =
	sizeof(rs_meg_expert_params) / sizeof(rs_meg_expert_params[0]);

static const char experts_key[] = "mlp.experts.";

/* Up to 9 digits: an expert number (no sign, no leading '+'). */
static const char *parse_index(const char *s, long *out)
{
	long v = 0;
	int n = 0;

	for (; *s >= '0' && *s <= '9'; s++, n++) {
		if (n == 9)
			return NULL;
		v = v * 10 + (*s - '0');
	}
	if (!n)
		return NULL;
	*out = v;
	return s;
}

bool rs_meg_expert_key(const char *key, rs_meg_experts *form, int *param,
		       long *local, size_t *at)
{
	const char *p = NULL, *s;

	for (const char *q = key; (q = strstr(q, experts_key)); q++)
		if (q == key || q[-1] == '.')
			p = q;   /* the last one */
	if (!p)
		return false;
	s = p + sizeof(experts_key) - 1;
	*at = (size_t)(s - key);
	for (size_t k = 0; k < rs_meg_expert_nparams; k++) {
		const rs_meg_expert_param *ep = &rs_meg_expert_params[k];
		size_t n = strlen(ep->param);
		const char *e;

		/* SequentialMLP: local_experts.<i>.<param> */
		if (strncmp(s, "local_experts.", 14) == 0 &&
		    (e = parse_index(s + 14, local)) && *e == '.' &&
		    strcmp(e + 1, ep->param) == 0) {
			*form = RS_MEG_EXPERTS_SEQUENTIAL;
			*param = (int)k;
			return true;
		}
		/* TEGroupedMLP: <param><i> */
		if (strncmp(s, ep->param, n) == 0 &&
		    (e = parse_index(s + n, local)) && !*e) {
			*form = RS_MEG_EXPERTS_TE;
			*param = (int)k;
			return true;
		}
		/* GroupedMLP: weight1 / weight2 */
		if (ep->grouped && strcmp(s, ep->grouped) == 0) {
			*form = RS_MEG_EXPERTS_GROUPED;
			*param = (int)k;
			*local = -1;
			return true;
		}
	}
	return false;
}

int rs_meg_expert_suffix(rs_meg_experts form, int param, uint64_t local,
			 char *out, size_t size)
{
	const rs_meg_expert_param *ep = &rs_meg_expert_params[param];
	int n;

	switch (form) {
	case RS_MEG_EXPERTS_SEQUENTIAL:
		n = snprintf(out, size, "local_experts.%llu.%s",
			     (unsigned long long)local, ep->param);
		break;
	case RS_MEG_EXPERTS_TE:
		n = snprintf(out, size, "%s%llu", ep->param,
			     (unsigned long long)local);
		break;
	case RS_MEG_EXPERTS_GROUPED:
		if (!ep->grouped)
			return -EINVAL;
		n = snprintf(out, size, "%s", ep->grouped);
		break;
	default:
		return -EINVAL;
	}
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}
