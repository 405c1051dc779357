/* rows: the "names" list of a -o rules= file, as family rows
 * (formats/bridge/bridge.h; the schema is in reshardfs(1)):
 *   {"names": [{"family": "llama", "from": "mcore", "to": "hf",
 *               "target": "<pattern>" | null, "op": "same", ...,
 *               "sources": ["<pattern>", ...], "when": "tied"|"untied"}]}
 */
#include "formats/bridge/bridge_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define ROW_PATTERN_MAX 400
_Static_assert(ROW_PATTERN_MAX <= RS_MAP_PATTERN_MAX,
	       "every pattern a rules file may hold is one rs_map_match takes");

static const char *str_of(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A pattern a row may hold: printable ASCII, not too long. */
static bool pattern_ok(const char *s)
{
	size_t n = strlen(s);

	if (!n || n > ROW_PATTERN_MAX)
		return false;
	for (; *s; s++)
		if (*s < 0x21 || *s > 0x7e)
			return false;
	return true;
}

int rs_bridge_row_parse(const cJSON *o, const char *path, size_t k,
			rs_map_row *r, rs_diag *d)
{
	const cJSON *target = cJSON_GetObjectItemCaseSensitive(o, "target");
	const cJSON *src = cJSON_GetObjectItemCaseSensitive(o, "sources");
	const char *op = str_of(o, "op"), *when = str_of(o, "when");
	int opn = op ? rs_map_op_from_name(op) : RS_MAP_SAME, n = 0;
	const cJSON *it;

	memset(r, 0, sizeof(*r));
	if (opn < 0) {
		rs_diag_add(d, "%s: names row %zu: \"op\" must be same, qkv_q, qkv_k, qkv_v, fuse_qkv, qkv_flat, flat_qkv, half_0, half_1, cat or vocab",
			    path, k);
		return -EINVAL;
	}
	r->op = (rs_map_op)opn;
	if (!(cJSON_IsNull(target) ||
	      (cJSON_IsString(target) && pattern_ok(target->valuestring)))) {
		rs_diag_add(d, "%s: names row %zu: \"target\" must be a name pattern (printable, at most %d characters) or null",
			    path, k, ROW_PATTERN_MAX);
		return -EINVAL;
	}
	if (!cJSON_IsArray(src) ||
	    cJSON_GetArraySize(src) != rs_map_op_sources(r->op)) {
		rs_diag_add(d, "%s: names row %zu: \"sources\" must be a list of %d name pattern%s for op %s",
			    path, k, rs_map_op_sources(r->op),
			    rs_map_op_sources(r->op) == 1 ? "" : "s",
			    rs_map_op_name(r->op));
		return -EINVAL;
	}
	static const char *const whens[] = { [RS_WHEN_TIED] = "tied",
		[RS_WHEN_UNTIED] = "untied", [RS_WHEN_PACKED] = "packed",
		[RS_WHEN_PER_EXPERT] = "per_expert" };

	r->when = RS_WHEN_ALWAYS;
	for (int w = RS_WHEN_TIED; when && w <= RS_WHEN_PER_EXPERT; w++)
		if (strcmp(when, whens[w]) == 0)
			r->when = (rs_when)w;
	if (when && r->when == RS_WHEN_ALWAYS) {
		rs_diag_add(d, "%s: names row %zu: \"when\" must be \"tied\", \"untied\", \"packed\" or \"per_expert\"",
			    path, k);
		return -EINVAL;
	}
	cJSON_ArrayForEach(it, src) {
		if (!cJSON_IsString(it) || !pattern_ok(it->valuestring)) {
			rs_diag_add(d, "%s: names row %zu: source %d is not a name pattern",
				    path, k, n);
			return -EINVAL;
		}
		if (!(r->from[n++] = strdup(it->valuestring)))
			return -ENOMEM;
	}
	/* '*' stands for names the row cannot spell back */
	for (int i = 0; cJSON_IsString(target) && i < n; i++)
		if (strchr(r->from[i], '*')) {
			rs_diag_add(d, "%s: names row %zu: source %d has a '*', which only a row with a null \"target\" (one that leaves its sources out) may have",
				    path, k, i);
			return -EINVAL;
		}
	if (cJSON_IsString(target) && !(r->to = strdup(target->valuestring)))
		return -ENOMEM;
	return 0;
}

void rs_bridge_rows_free(rs_map_row *rows, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free((char *)rows[i].to);
		for (int k = 0; k < RS_MAP_MAX_FROM; k++)
			free((char *)rows[i].from[k]);
	}
	free(rows);
}

int rs_bridge_rows_parse(const cJSON *root, const rs_family *f,
			 const char *path, rs_map_row **rows, size_t *n,
			 rs_diag *d)
{
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "names");
	const cJSON *o;
	size_t k = 0;
	int err = 0;

	*rows = NULL;
	*n = 0;
	if (!list)
		return 0;
	if (!cJSON_IsArray(list)) {
		rs_diag_add(d, "%s: \"names\" must be a list of rows", path);
		return -EINVAL;
	}
	*rows = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof(**rows));
	if (!*rows)
		return -ENOMEM;
	cJSON_ArrayForEach(o, list) {
		const char *fam = str_of(o, "family"), *from = str_of(o, "from");
		const char *to = str_of(o, "to");

		if (!cJSON_IsObject(o) || !fam || !from || !to) {
			rs_diag_add(d, "%s: names row %zu: needs \"family\", \"from\" and \"to\" strings",
				    path, k);
			err = -EINVAL;
			break;
		}
		if (strcmp(fam, f->name) || strcmp(from, f->from) ||
		    strcmp(to, f->to)) {
			k++;
			continue;
		}
		err = rs_bridge_row_parse(o, path, k++, &(*rows)[*n], d);
		(*n)++;
		if (err)
			break;
	}
	if (err) {
		rs_bridge_rows_free(*rows, *n);
		*rows = NULL;
		*n = 0;
	}
	return err;
}
