/* The ops of the family tables (formats/model.h), by the names family
 * files and rules files spell them; the tables themselves are data
 * (share/reshardfs/families/, read by formats/bridge/family.c). */
#include "formats/model.h"

#include <stdlib.h>
#include <string.h>

static const struct {
	const char *name;
	int sources;
} ops[] = {
	[RS_MAP_SAME] = { "same", 1 },
	[RS_MAP_QKV_Q] = { "qkv_q", 1 },
	[RS_MAP_QKV_K] = { "qkv_k", 1 },
	[RS_MAP_QKV_V] = { "qkv_v", 1 },
	[RS_MAP_FUSE_QKV] = { "fuse_qkv", 3 },
	[RS_MAP_HALF_0] = { "half_0", 1 },
	[RS_MAP_HALF_1] = { "half_1", 1 },
	[RS_MAP_CAT] = { "cat", 2 },
	[RS_MAP_VOCAB] = { "vocab", 1 },
	[RS_MAP_QKV_FLAT] = { "qkv_flat", 1 },
	[RS_MAP_FLAT_QKV] = { "flat_qkv", 1 },
};

int rs_map_op_from_name(const char *s)
{
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (strcmp(ops[i].name, s) == 0)
			return (int)i;
	return -1;
}

const char *rs_map_op_name(rs_map_op op)
{
	return (size_t)op < sizeof(ops) / sizeof(ops[0]) ? ops[op].name : NULL;
}

int rs_map_op_sources(rs_map_op op)
{
	return (size_t)op < sizeof(ops) / sizeof(ops[0]) ? ops[op].sources : 0;
}

void rs_model_config_free(rs_model_config *m)
{
	free(m->hf_config);
	free(m->hf_config_out);
	free(m->hf_config_from);
	free(m->fact_lines);
	rs_families_free(m->families);
	m->hf_config = m->hf_config_out = m->fact_lines = NULL;
	m->hf_config_from = NULL;
	m->families = NULL;
	m->family = NULL;
}
