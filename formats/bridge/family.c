/* family: family files into the bridge's tables (formats/bridge/family.h). */
#include "formats/bridge/family.h"
#include "formats/bridge/bridge_int.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/codec/json_text.h"
#include "planner/array.h"
#include "planner/user_file.h"

#define FILE_MAX (1u << 20)
#define MAX_FILES 256           /* family files in the directory */
#define MAX_ITEMS 4096          /* rows, facts, checks, names in a list */
#define MAX_BASE_DEPTH 8
#define TEXT_MAX 400

static const char *const ecos[] = { "mcore", "hf", "metaseq" };
#define NECO (sizeof(ecos) / sizeof(ecos[0]))

/* ---- small checked readers ------------------------------------------ */

typedef struct {
	const char *path;       /* the file, for messages */
	const char *what;       /* "family qwen3", for messages */
	rs_diag *d;
} ctx;

static int bad(const ctx *c, const char *fmt, const char *a, const char *b)
{
	char line[600];

	snprintf(line, sizeof(line), fmt, a ? a : "", b ? b : "");
	rs_diag_add(c->d, "%s: %s: %s", c->path, c->what, line);
	return -EINVAL;
}

/* Printable ASCII, 1..TEXT_MAX bytes. */
static bool text_ok(const char *s)
{
	size_t n = strlen(s);

	if (!n || n > TEXT_MAX)
		return false;
	for (; *s; s++)
		if (*s < 0x20 || *s > 0x7e)
			return false;
	return true;
}

/* Field `key` of o: NULL into *out when absent; a copy of a text;
 * -EINVAL reported for anything else. */
static int text_field(const ctx *c, const cJSON *o, const char *key,
		      char **out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	*out = NULL;
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsString(v) || !text_ok(v->valuestring))
		return bad(c, "\"%s\" must be a printable text of at most 400 characters%s",
			   key, "");
	*out = strdup(v->valuestring);
	return *out ? 0 : -ENOMEM;
}

/* A list of texts (NULL-terminated copy, *n of them). */
static int text_list(const ctx *c, const cJSON *v, const char *key,
		     char ***out, size_t *n)
{
	const cJSON *it;
	size_t k = 0;

	*out = NULL;
	if (n)
		*n = 0;
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > MAX_ITEMS)
		return bad(c, "\"%s\" must be a list of texts%s", key, "");
	*out = calloc((size_t)cJSON_GetArraySize(v) + 1, sizeof(char *));
	if (!*out)
		return -ENOMEM;
	cJSON_ArrayForEach(it, v) {
		if (!cJSON_IsString(it) || !text_ok(it->valuestring))
			return bad(c, "\"%s\" must be a list of printable texts of at most 400 characters%s",
				   key, "");
		if (!((*out)[k++] = strdup(it->valuestring)))
			return -ENOMEM;
	}
	if (n)
		*n = k;
	return 0;
}

static void free_list(char **l)
{
	for (size_t i = 0; l && l[i]; i++)
		free(l[i]);
	free(l);
}

/* ---- facts and checks ------------------------------------------------ */

static const char *const types[] = {
	[RS_FACT_INT] = "int", [RS_FACT_REAL] = "real",
	[RS_FACT_BOOL] = "bool", [RS_FACT_STR] = "str",
	[RS_FACT_OBJECT] = "object", [RS_FACT_LIST] = "list",
};

static void fact_free(rs_fact_def *f)
{
	free(f->hf);
	free(f->args);
	free(f->model);
	free(f->shape);
	free(f->per);
	free(f->count);
	free_list(f->absent);
	free(f->when_args);
	free(f->same_as);
	cJSON_Delete(f->value);
	cJSON_Delete(f->dflt);
	for (size_t i = 0; i < f->nfields; i++)
		fact_free(&f->fields[i]);
	free(f->fields);
	memset(f, 0, sizeof(*f));
}

/* A constant of the fact's type (JSON null: none). */
static int constant(const ctx *c, const cJSON *o, const char *key,
		    rs_fact_type t, cJSON **out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	bool ok;

	*out = NULL;
	if (!v || cJSON_IsNull(v))
		return 0;
	switch (t) {
	case RS_FACT_INT:
	case RS_FACT_REAL:
		ok = cJSON_IsNumber(v);
		break;
	case RS_FACT_BOOL:
		ok = cJSON_IsBool(v);
		break;
	case RS_FACT_STR:
		ok = cJSON_IsString(v) && text_ok(v->valuestring);
		break;
	case RS_FACT_LIST:
		ok = cJSON_IsArray(v) && cJSON_GetArraySize(v) <= 4096;
		break;
	default:
		ok = false;
	}
	if (!ok)
		return bad(c, "\"%s\" is not a value of the fact's type%s", key, "");
	*out = cJSON_Duplicate(v, true);
	return *out ? 0 : -ENOMEM;
}

static int parse_fact(const ctx *c0, const cJSON *o, int depth,
		      rs_fact_def *f);

static int parse_fields(const ctx *c, const cJSON *o, int depth,
			rs_fact_def *f)
{
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "fields");
	const cJSON *it;
	int err = 0;

	if (!cJSON_IsArray(list) || !cJSON_GetArraySize(list) ||
	    cJSON_GetArraySize(list) > 64 || depth > 0)
		return bad(c, "fact %s: an object fact needs \"fields\", a list of facts (one level)%s",
			   f->hf, "");
	f->fields = calloc((size_t)cJSON_GetArraySize(list), sizeof(*f->fields));
	if (!f->fields)
		return -ENOMEM;
	cJSON_ArrayForEach(it, list) {
		err = parse_fact(c, it, depth + 1, &f->fields[f->nfields++]);
		if (err)
			break;
	}
	return err;
}

static int parse_fact(const ctx *c, const cJSON *o, int depth, rs_fact_def *f)
{
	const cJSON *type, *axis, *req;
	int err = 0, t;

	memset(f, 0, sizeof(*f));
	if (!cJSON_IsObject(o))
		return bad(c, "\"config\" holds a value that is not an object%s%s",
			   "", "");
	err = text_field(c, o, "hf", &f->hf);
	if (!err && !f->hf)
		err = bad(c, "a config fact has no \"hf\" field name%s%s", "", "");
	type = cJSON_GetObjectItemCaseSensitive(o, "type");
	for (t = 0; !err && t < (int)(sizeof(types) / sizeof(types[0])); t++)
		if (cJSON_IsString(type) && strcmp(type->valuestring, types[t]) == 0)
			break;
	if (!err && t == (int)(sizeof(types) / sizeof(types[0])))
		err = bad(c, "fact %s: \"type\" must be int, real, bool, str, object or list%s",
			  f->hf, "");
	if (err)
		return err;
	f->type = (rs_fact_type)t;
	err = text_field(c, o, "args", &f->args);
	if (!err)
		err = text_field(c, o, "model", &f->model);
	if (!err)
		err = text_field(c, o, "shape", &f->shape);
	if (!err)
		err = text_field(c, o, "per", &f->per);
	if (!err)
		err = text_field(c, o, "count", &f->count);
	if (!err)
		err = text_field(c, o, "when_args", &f->when_args);
	if (!err)
		err = text_field(c, o, "same_as", &f->same_as);
	if (!err)
		err = text_list(c, cJSON_GetObjectItemCaseSensitive(o, "absent"),
				"absent", &f->absent, &f->nabsent);
	if (!err)
		err = constant(c, o, "value", f->type, &f->value);
	if (!err)
		err = constant(c, o, "default", f->type, &f->dflt);
	if (err)
		return err;
	axis = cJSON_GetObjectItemCaseSensitive(o, "axis");
	if (axis && !(cJSON_IsNumber(axis) && axis->valuedouble >= 0 &&
		      axis->valuedouble < RS_MAX_DIMS &&
		      axis->valuedouble == (int)axis->valuedouble))
		return bad(c, "fact %s: \"axis\" must be an axis number below 8%s",
			   f->hf, "");
	f->axis = axis ? (int)axis->valuedouble : 0;
	req = cJSON_GetObjectItemCaseSensitive(o, "negate");
	if (req && !(cJSON_IsBool(req) && f->type == RS_FACT_BOOL))
		return bad(c, "fact %s: \"negate\" is true or false, for a bool fact%s", f->hf, "");
	f->negate = cJSON_IsTrue(req);
	req = cJSON_GetObjectItemCaseSensitive(o, "required");
	if (req && !cJSON_IsBool(req))
		return bad(c, "fact %s: \"required\" must be true or false%s", f->hf, "");
	f->required = cJSON_IsTrue(req);
	req = cJSON_GetObjectItemCaseSensitive(o, "nullable");
	if (req && !cJSON_IsBool(req))
		return bad(c, "fact %s: \"nullable\" must be true or false%s", f->hf, "");
	f->nullable = cJSON_IsTrue(req);
	if ((f->shape || f->count) && f->type != RS_FACT_INT)
		return bad(c, "fact %s: a fact from a shape or a count is an int%s",
			   f->hf, "");
	if (f->nabsent && f->type != RS_FACT_BOOL)
		return bad(c, "fact %s: a fact from \"absent\" tensors is a bool%s",
			   f->hf, "");
	if (f->type == RS_FACT_OBJECT)
		return parse_fields(c, o, depth, f);
	return 0;
}

static int parse_check(const ctx *c, const cJSON *o, rs_check_def *k)
{
	const cJSON *in = cJSON_GetObjectItemCaseSensitive(o, "in");
	int err, n;

	memset(k, 0, sizeof(*k));
	if (!cJSON_IsObject(o))
		return bad(c, "\"checks\" holds a value that is not an object%s%s",
			   "", "");
	err = text_field(c, o, "args", &k->args);
	if (!err)
		err = text_field(c, o, "hf", &k->hf);
	if (!err)
		err = text_field(c, o, "model", &k->model);
	if (err)
		return err;
	n = !!k->args + !!k->hf + !!k->model;
	if (n != 1 || !cJSON_IsArray(in) || !cJSON_GetArraySize(in) ||
	    cJSON_GetArraySize(in) > 64)
		return bad(c, "a check needs one of \"args\", \"hf\" or \"model\", and \"in\", a list of the values allowed%s%s",
			   "", "");
	k->in = cJSON_Duplicate(in, true);
	return k->in ? 0 : -ENOMEM;
}

static void check_free(rs_check_def *k)
{
	free(k->args);
	free(k->hf);
	free(k->model);
	cJSON_Delete(k->in);
}

/* ---- one family ------------------------------------------------------ */

/* Rows of a family object (family files' rows need no "family"). */
typedef struct {
	rs_map_row *rows;
	char (*dir)[2][8];      /* each row's from and to */
	size_t n;
} row_list;

static int eco_index(const char *s)
{
	for (size_t i = 0; i < NECO; i++)
		if (strcmp(s, ecos[i]) == 0)
			return (int)i;
	return -1;
}

static int parse_ecos(const ctx *c, const cJSON *o, rs_family_info *fi)
{
	static const char *const keys[] = { "embed", "strip", "objects" };
	int err = 0;

	fi->neco = NECO;
	for (size_t e = 0; e < NECO; e++) {
		fi->eco[e].eco = strdup(ecos[e]);
		if (!fi->eco[e].eco)
			return -ENOMEM;
	}
	for (size_t k = 0; k < 3 && !err; k++) {
		const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, keys[k]), *it;

		if (!m)
			continue;
		if (!cJSON_IsObject(m))
			return bad(c, "\"%s\" must be an object keyed by mcore, hf or metaseq%s",
				   keys[k], "");
		cJSON_ArrayForEach(it, m) {
			int e = eco_index(it->string);

			if (e < 0)
				return bad(c, "\"%s\": \"%s\" is not mcore, hf or metaseq",
					   keys[k], it->string);
			if (k == 0)
				err = text_field(c, m, it->string, &fi->eco[e].embed);
			else if (k == 1)
				err = text_field(c, m, it->string, &fi->eco[e].strip);
			else
				err = text_list(c, it, "objects", &fi->eco[e].objects,
						NULL);
			if (err)
				return err;
		}
	}
	return err;
}

static int parse_rows(const ctx *c, const cJSON *o, const char *name,
		      row_list *rl)
{
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "names"), *it;
	size_t k = 0;

	if (!list)
		return 0;
	if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) > MAX_ITEMS)
		return bad(c, "\"names\" must be a list of at most 4096 rows%s%s", "", "");
	rl->rows = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof(*rl->rows));
	rl->dir = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof(*rl->dir));
	if (!rl->rows || !rl->dir)
		return -ENOMEM;
	cJSON_ArrayForEach(it, list) {
		const cJSON *fam = cJSON_GetObjectItemCaseSensitive(it, "family");
		const cJSON *from = cJSON_GetObjectItemCaseSensitive(it, "from");
		const cJSON *to = cJSON_GetObjectItemCaseSensitive(it, "to");
		char where[40];
		int err;

		snprintf(where, sizeof(where), "%zu", k);
		if (!cJSON_IsObject(it) || !cJSON_IsString(from) ||
		    !cJSON_IsString(to) || eco_index(from->valuestring) < 0 ||
		    eco_index(to->valuestring) < 0 ||
		    strcmp(from->valuestring, to->valuestring) == 0)
			return bad(c, "names row %s: needs \"from\" and \"to\", two of mcore, hf and metaseq%s",
				   where, "");
		if (fam && !(cJSON_IsString(fam) && strcmp(fam->valuestring, name) == 0))
			return bad(c, "names row %s: \"family\" is not this family's name%s",
				   where, "");
		err = rs_bridge_row_parse(it, c->path, k, &rl->rows[rl->n], c->d);
		if (err)
			return err;
		snprintf(rl->dir[rl->n][0], 8, "%s", from->valuestring);
		snprintf(rl->dir[rl->n][1], 8, "%s", to->valuestring);
		rl->n++;
		k++;
	}
	return 0;
}

static void info_free(rs_family_info *fi)
{
	free(fi->name);
	free(fi->path);
	free(fi->base);
	free_list(fi->arch);
	free(fi->model_type);
	free_list(fi->detect);
	free(fi->experts);
	for (size_t i = 0; i < fi->nfacts; i++)
		fact_free(&fi->facts[i]);
	free(fi->facts);
	for (size_t i = 0; i < fi->nchecks; i++)
		check_free(&fi->checks[i]);
	free(fi->checks);
	for (size_t e = 0; e < fi->neco; e++) {
		free(fi->eco[e].eco);
		free(fi->eco[e].embed);
		free(fi->eco[e].strip);
		free_list(fi->eco[e].objects);
	}
	memset(fi, 0, sizeof(*fi));
}

static void rows_free(row_list *rl)
{
	rs_bridge_rows_free(rl->rows, rl->n);
	free(rl->dir);
	memset(rl, 0, sizeof(*rl));
}

/* A family object (o) from file `path` into fi and its rows. */
static int parse_family(const cJSON *o, const char *path, rs_family_info *fi,
			row_list *rl, rs_diag *d)
{
	ctx c = { path, "a family", d };
	const cJSON *list, *it, *detect;
	const char *dup = NULL;
	char what[80];
	int err;

	memset(fi, 0, sizeof(*fi));
	memset(rl, 0, sizeof(*rl));
	if (!cJSON_IsObject(o))
		return bad(&c, "a family is a JSON object%s%s", "", "");
	err = rs_json_duplicate_key(o, &dup);
	if (!err && dup)
		return bad(&c, "\"%s\" is given twice%s", dup, "");
	err = text_field(&c, o, "family", &fi->name);
	if (err)
		return err;
	if (!fi->name || strspn(fi->name, "abcdefghijklmnopqrstuvwxyz0123456789_-.") !=
			 strlen(fi->name) || strlen(fi->name) > 64)
		return bad(&c, "\"family\" must name it: lower-case letters, digits, '_', '-' or '.', at most 64%s%s",
			   "", "");
	snprintf(what, sizeof(what), "family %s", fi->name);
	c.what = what;
	if (!(fi->path = strdup(path)))
		return -ENOMEM;
	err = text_field(&c, o, "base", &fi->base);
	if (!err)
		err = text_field(&c, o, "model_type", &fi->model_type);
	if (!err)
		err = text_field(&c, o, "experts", &fi->experts);
	if (!err)
		err = text_list(&c, cJSON_GetObjectItemCaseSensitive(o, "architectures"),
				"architectures", &fi->arch, &fi->narch);
	detect = cJSON_GetObjectItemCaseSensitive(o, "detect");
	if (!err && detect && !cJSON_IsNull(detect)) {
		fi->guessable = true;
		err = text_list(&c, detect, "detect", &fi->detect, &fi->ndetect);
	}
	if (!err) {
		const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stack_layers");

		if (st && !cJSON_IsBool(st))
			err = bad(&c, "\"stack_layers\" must be true or false%s%s", "", "");
		fi->per_layer = cJSON_IsFalse(st);
	}
	if (!err)
		err = parse_ecos(&c, o, fi);
	list = cJSON_GetObjectItemCaseSensitive(o, "config");
	if (!err && list && (!cJSON_IsArray(list) || cJSON_GetArraySize(list) > 256))
		err = bad(&c, "\"config\" must be a list of at most 256 facts%s%s", "", "");
	if (!err && list) {
		fi->facts = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof(*fi->facts));
		if (!fi->facts)
			return -ENOMEM;
		cJSON_ArrayForEach(it, list) {
			err = parse_fact(&c, it, 0, &fi->facts[fi->nfacts++]);
			if (err)
				break;
		}
	}
	list = cJSON_GetObjectItemCaseSensitive(o, "checks");
	if (!err && list && (!cJSON_IsArray(list) || cJSON_GetArraySize(list) > 256))
		err = bad(&c, "\"checks\" must be a list of at most 256 checks%s%s", "", "");
	if (!err && list) {
		fi->checks = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof(*fi->checks));
		if (!fi->checks)
			return -ENOMEM;
		cJSON_ArrayForEach(it, list) {
			err = parse_check(&c, it, &fi->checks[fi->nchecks++]);
			if (err)
				break;
		}
	}
	if (!err)
		err = parse_rows(&c, o, fi->name, rl);
	return err;
}

/* ---- loading --------------------------------------------------------- */

typedef struct {
	rs_family_info *infos;
	row_list *rows;
	size_t n, cap;
} loading;

static int add_family(loading *ld, const cJSON *o, const char *path,
		      bool user, rs_diag *d)
{
	rs_family_info fi;
	row_list rl;
	int err = parse_family(o, path, &fi, &rl, d);
	size_t at = ld->n;

	if (err)
		goto fail;
	for (size_t i = 0; i < ld->n; i++) {
		if (strcmp(ld->infos[i].name, fi.name))
			continue;
		if (!user) {
			rs_diag_add(d, "%s: family %s is defined in %s too; a family is one file",
				    path, fi.name, ld->infos[i].path);
			err = -EINVAL;
			goto fail;
		}
		/* the user's family replaces the built-in one */
		info_free(&ld->infos[i]);
		rows_free(&ld->rows[i]);
		at = i;
	}
	if (at == ld->n) {
		err = rs_array_reserve(&ld->infos, &ld->cap, ld->n + 1,
				       sizeof(*ld->infos));
		if (!err) {
			size_t cap = ld->cap;

			/* rows grow with infos */
			row_list *r = realloc(ld->rows, cap * sizeof(*r));

			if (!r)
				err = -ENOMEM;
			else
				ld->rows = r;
		}
		if (err)
			goto fail;
		ld->n++;
	}
	ld->infos[at] = fi;
	ld->rows[at] = rl;
	return 0;
fail:
	info_free(&fi);
	rows_free(&rl);
	return err;
}

static int load_file(loading *ld, const char *path, bool user, rs_diag *d)
{
	size_t len = 0;
	char *text = rs_user_file_read(path, FILE_MAX,
				       user ? "rules file" : "family file", &len, d);
	char why[160];
	cJSON *root = NULL;
	const cJSON *list, *it;
	int err;

	if (!text)
		return -EINVAL;
	err = rs_json_parse_object(text, len, &root, why, sizeof(why));
	free(text);
	if (err == -EINVAL)
		rs_diag_add(d, "%s: %s", path, why);
	if (err)
		return err;
	if (!user) {
		err = add_family(ld, root, path, false, d);
	} else if ((list = cJSON_GetObjectItemCaseSensitive(root, "families"))) {
		if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) > 64) {
			rs_diag_add(d, "%s: \"families\" must be a list of at most 64 family objects (the schema of share/reshardfs/families/)",
				    path);
			err = -EINVAL;
		}
		cJSON_ArrayForEach(it, list) {
			if (err)
				break;
			err = add_family(ld, it, path, true, d);
		}
	}
	cJSON_Delete(root);
	return err;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int load_dir(loading *ld, const char *dir, rs_diag *d)
{
	DIR *dh = opendir(dir);
	struct dirent *e;
	char *names[MAX_FILES];
	size_t n = 0;
	int err = 0;

	if (!dh) {
		rs_diag_add(d, "%s: cannot read the family files: %s", dir,
			    strerror(errno));
		return -EINVAL;
	}
	while ((e = readdir(dh)) && !err) {
		size_t l = strlen(e->d_name);

		if (l < 6 || strcmp(e->d_name + l - 5, ".json") || e->d_name[0] == '.')
			continue;
		if (n == MAX_FILES) {
			rs_diag_add(d, "%s: more than %d family files", dir, MAX_FILES);
			err = -EINVAL;
		} else if (asprintf(&names[n], "%s/%s", dir, e->d_name) < 0) {
			err = -ENOMEM;
		} else {
			n++;
		}
	}
	closedir(dh);
	qsort(names, n, sizeof(names[0]), by_name);
	for (size_t i = 0; i < n; i++) {
		if (!err)
			err = load_file(ld, names[i], false, d);
		free(names[i]);
	}
	return err;
}

const char *rs_families_dir(void)
{
	static char found[PATH_MAX];
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	struct stat st;

	if (n > 0) {
		char *slash;

		exe[n] = 0;
		slash = strrchr(exe, '/');
		if (slash) {
			*slash = 0;
			char rel[PATH_MAX + 32];

			snprintf(rel, sizeof(rel), "%.*s/../share/reshardfs/families",
				 PATH_MAX - 1, exe);
			if (realpath(rel, found) && stat(found, &st) == 0 &&
			    S_ISDIR(st.st_mode))
				return found;
		}
	}
#ifdef RS_FAMILY_DIR_INSTALLED
	if (stat(RS_FAMILY_DIR_INSTALLED, &st) == 0 && S_ISDIR(st.st_mode))
		return RS_FAMILY_DIR_INSTALLED;
#endif
#ifdef RS_FAMILY_DIR_SOURCE
	if (stat(RS_FAMILY_DIR_SOURCE, &st) == 0 && S_ISDIR(st.st_mode))
		return RS_FAMILY_DIR_SOURCE;
#endif
	return NULL;
}

/* ---- bases and directions ------------------------------------------- */

static rs_family_info *find_info(loading *ld, const char *name)
{
	for (size_t i = 0; i < ld->n; i++)
		if (strcmp(ld->infos[i].name, name) == 0)
			return &ld->infos[i];
	return NULL;
}

static bool has_fact(const rs_family_info *fi, const char *hf)
{
	for (size_t i = 0; i < fi->nfacts; i++)
		if (strcmp(fi->facts[i].hf, hf) == 0)
			return true;
	return false;
}

static const char *check_key(const rs_check_def *k)
{
	return k->args ? k->args : k->hf ? k->hf : k->model;
}

static bool has_check(const rs_family_info *fi, const rs_check_def *k)
{
	for (size_t i = 0; i < fi->nchecks; i++)
		if (!!fi->checks[i].args == !!k->args &&
		    !!fi->checks[i].hf == !!k->hf &&
		    strcmp(check_key(&fi->checks[i]), check_key(k)) == 0)
			return true;
	return false;
}

static char *dup_or_null(const char *s, int *err)
{
	char *c = s ? strdup(s) : NULL;

	if (s && !c)
		*err = -ENOMEM;
	return c;
}

static int copy_fact(rs_fact_def *to, const rs_fact_def *f)
{
	int err = 0;

	memset(to, 0, sizeof(*to));
	to->type = f->type;
	to->axis = f->axis;
	to->required = f->required;
	to->nullable = f->nullable;
	to->hf = dup_or_null(f->hf, &err);
	to->args = dup_or_null(f->args, &err);
	to->model = dup_or_null(f->model, &err);
	to->shape = dup_or_null(f->shape, &err);
	to->per = dup_or_null(f->per, &err);
	to->count = dup_or_null(f->count, &err);
	to->when_args = dup_or_null(f->when_args, &err);
	to->same_as = dup_or_null(f->same_as, &err);
	to->negate = f->negate;
	if (f->value && !(to->value = cJSON_Duplicate(f->value, true)))
		err = -ENOMEM;
	if (f->dflt && !(to->dflt = cJSON_Duplicate(f->dflt, true)))
		err = -ENOMEM;
	if (f->nabsent) {
		to->absent = calloc(f->nabsent + 1, sizeof(char *));
		if (!to->absent)
			return -ENOMEM;
		for (size_t i = 0; i < f->nabsent; i++)
			to->absent[i] = dup_or_null(f->absent[i], &err);
		to->nabsent = f->nabsent;
	}
	if (f->nfields) {
		to->fields = calloc(f->nfields, sizeof(*to->fields));
		if (!to->fields)
			return -ENOMEM;
		for (size_t i = 0; i < f->nfields && !err; i++, to->nfields++)
			err = copy_fact(&to->fields[i], &f->fields[i]);
	}
	return err;
}

/* Family i with its base's rows, facts, checks and ecosystem fields
 * taken in (the base resolved first, depth-first). */
static int resolve(loading *ld, size_t i, int depth, bool *done, rs_diag *d)
{
	rs_family_info *fi = &ld->infos[i], *b;
	row_list *rl = &ld->rows[i], *brl;
	size_t bi;
	int err = 0;

	if (done[i] || !fi->base)
		return done[i] = true, 0;
	b = find_info(ld, fi->base);
	if (!b || depth > MAX_BASE_DEPTH) {
		rs_diag_add(d, "%s: family %s: base %s %s", fi->path, fi->name,
			    fi->base, b ? "is too deep a chain (8 at most, or a loop)"
				       : "is no family here");
		return -EINVAL;
	}
	bi = (size_t)(b - ld->infos);
	err = resolve(ld, bi, depth + 1, done, d);
	if (err)
		return err;
	b = &ld->infos[bi];
	brl = &ld->rows[bi];
	/* rows: this family's first, then the base's */
	if (brl->n) {
		rs_map_row *rows = realloc(rl->rows, (rl->n + brl->n + 1) * sizeof(*rows));
		char (*dir)[2][8] = NULL;

		if (!rows)
			return -ENOMEM;
		rl->rows = rows;
		dir = realloc(rl->dir, (rl->n + brl->n + 1) * sizeof(*dir));
		if (!dir)
			return -ENOMEM;
		rl->dir = dir;
		for (size_t k = 0; k < brl->n; k++) {
			rs_map_row *r = &rl->rows[rl->n];

			*r = brl->rows[k];
			r->tier = brl->rows[k].tier + 1;
			r->to = dup_or_null(brl->rows[k].to, &err);
			for (int s = 0; s < RS_MAP_MAX_FROM; s++)
				r->from[s] = dup_or_null(brl->rows[k].from[s], &err);
			memcpy(rl->dir[rl->n], brl->dir[k], sizeof(*dir));
			rl->n++;
		}
		memset(&rl->rows[rl->n], 0, sizeof(*rl->rows));
	}
	for (size_t k = 0; k < b->nfacts && !err; k++) {
		rs_fact_def *f;

		if (has_fact(fi, b->facts[k].hf))
			continue;
		f = realloc(fi->facts, (fi->nfacts + 1) * sizeof(*f));
		if (!f)
			return -ENOMEM;
		fi->facts = f;
		err = copy_fact(&fi->facts[fi->nfacts++], &b->facts[k]);
	}
	for (size_t k = 0; k < b->nchecks && !err; k++) {
		rs_check_def *c;

		if (has_check(fi, &b->checks[k]))
			continue;
		c = realloc(fi->checks, (fi->nchecks + 1) * sizeof(*c));
		if (!c)
			return -ENOMEM;
		fi->checks = c;
		c = &fi->checks[fi->nchecks++];
		memset(c, 0, sizeof(*c));
		c->args = dup_or_null(b->checks[k].args, &err);
		c->hf = dup_or_null(b->checks[k].hf, &err);
		c->model = dup_or_null(b->checks[k].model, &err);
		if (!(c->in = cJSON_Duplicate(b->checks[k].in, true)))
			err = -ENOMEM;
	}
	for (size_t e = 0; e < NECO && !err; e++) {
		if (!fi->eco[e].embed)
			fi->eco[e].embed = dup_or_null(b->eco[e].embed, &err);
		if (!fi->eco[e].strip)
			fi->eco[e].strip = dup_or_null(b->eco[e].strip, &err);
		if (!fi->eco[e].objects && b->eco[e].objects) {
			size_t n = 0;

			while (b->eco[e].objects[n])
				n++;
			fi->eco[e].objects = calloc(n + 1, sizeof(char *));
			if (!fi->eco[e].objects)
				return -ENOMEM;
			for (size_t k = 0; k < n; k++)
				fi->eco[e].objects[k] = dup_or_null(b->eco[e].objects[k], &err);
		}
	}
	if (!err && !fi->experts)
		fi->experts = dup_or_null(b->experts, &err);
	done[i] = true;
	return err;
}

/* One table per family and direction its rows go. */
static int make_dirs(rs_families *fs, loading *ld)
{
	fs->dirs = calloc(ld->n * NECO * NECO + 1, sizeof(*fs->dirs));
	fs->rows = calloc(ld->n * NECO * NECO + 1, sizeof(*fs->rows));
	if (!fs->dirs || !fs->rows)
		return -ENOMEM;
	for (size_t i = 0; i < ld->n; i++) {
		const rs_family_info *fi = &ld->infos[i];
		const row_list *rl = &ld->rows[i];

		for (size_t a = 0; a < NECO; a++)
			for (size_t b = 0; b < NECO; b++) {
				rs_family *f = &fs->dirs[fs->ndirs];
				rs_map_row *rows;
				size_t n = 0;

				for (size_t k = 0; k < rl->n; k++)
					n += strcmp(rl->dir[k][0], ecos[a]) == 0 &&
					     strcmp(rl->dir[k][1], ecos[b]) == 0;
				if (!n)
					continue;
				rows = calloc(n + 1, sizeof(*rows));
				if (!rows)
					return -ENOMEM;
				fs->rows[fs->ndirs] = rows;
				n = 0;
				for (size_t k = 0; k < rl->n; k++)
					if (strcmp(rl->dir[k][0], ecos[a]) == 0 &&
					    strcmp(rl->dir[k][1], ecos[b]) == 0)
						rows[n++] = rl->rows[k];   /* borrowed */
				f->name = fi->name;
				f->from = ecos[a];
				f->to = ecos[b];
				f->rows = rows;
				f->stack = strcmp(ecos[b], "mcore") == 0 &&
					   !fi->per_layer;
				f->strip = fi->eco[a].strip;
				f->embed = fi->eco[a].embed;
				f->objects = (const char *const *)fi->eco[b].objects;
				f->info = &fs->infos[i];
				fs->ndirs++;
			}
	}
	return 0;
}

void rs_families_free(rs_families *fs)
{
	if (!fs)
		return;
	for (size_t i = 0; fs->rows && i < fs->ndirs; i++) {
		size_t n = 0;

		while (fs->rows[i] && fs->rows[i][n].from[0])
			n++;
		rs_bridge_rows_free(fs->rows[i], n);
	}
	free(fs->rows);
	free(fs->dirs);
	for (size_t i = 0; i < fs->ninfo; i++)
		info_free(&fs->infos[i]);
	free(fs->infos);
	free(fs->dir);
	free(fs->list);
	free(fs);
}

int rs_families_load(const char *rules_file, rs_families **out, rs_diag *d)
{
	rs_families *fs = calloc(1, sizeof(*fs));
	loading ld = { 0 };
	const char *dir = rs_families_dir();
	bool *done = NULL;
	size_t at = 0;
	int err = 0;

	*out = NULL;
	if (!fs)
		return -ENOMEM;
	if (!dir) {
		rs_diag_add(d, "reshardfs: no family files found (share/reshardfs/families beside the daemon, or where it was installed): reinstall reshardfs");
		err = -EINVAL;
	}
	if (!err && !(fs->dir = strdup(dir)))
		err = -ENOMEM;
	if (!err)
		err = load_dir(&ld, dir, d);
	if (!err && rules_file)
		err = load_file(&ld, rules_file, true, d);
	if (!err && !(done = calloc(ld.n + 1, sizeof(bool))))
		err = -ENOMEM;
	for (size_t i = 0; i < ld.n && !err; i++)
		err = resolve(&ld, i, 0, done, d);
	free(done);
	fs->infos = ld.infos;
	fs->ninfo = ld.n;
	if (!err)
		err = make_dirs(fs, &ld);
	/* the rows now belong to the tables (make_dirs borrowed them) */
	for (size_t i = 0; i < ld.n; i++) {
		if (err)
			rs_bridge_rows_free(ld.rows[i].rows, ld.rows[i].n);
		else
			free(ld.rows[i].rows);
		free(ld.rows[i].dir);
	}
	free(ld.rows);
	if (!err && !(fs->list = calloc(1, ld.n * 66 + 1)))
		err = -ENOMEM;
	for (size_t i = 0; i < ld.n && !err; i++)
		at += (size_t)sprintf(fs->list + at, "%s%s", i ? ", " : "",
				      fs->infos[i].name);
	if (err) {
		/* rows owned by no table any more: the tables must not free them */
		if (fs->rows)
			for (size_t i = 0; i < fs->ndirs; i++) {
				free(fs->rows[i]);
				fs->rows[i] = NULL;
			}
		rs_families_free(fs);
		return err;
	}
	*out = fs;
	return 0;
}

const rs_family *rs_families_find(const rs_families *fs, const char *name,
				  const char *from, const char *to)
{
	for (size_t i = 0; fs && i < fs->ndirs; i++)
		if (strcmp(fs->dirs[i].name, name) == 0 &&
		    strcmp(fs->dirs[i].from, from) == 0 &&
		    strcmp(fs->dirs[i].to, to) == 0)
			return &fs->dirs[i];
	return NULL;
}

const rs_family *rs_families_by_arch(const rs_families *fs, const char *arch,
				     const char *type, const char *from,
				     const char *to)
{
	/* the last loaded first: a rules file's family over a built-in one */
	for (size_t i = fs ? fs->ndirs : 0; arch && i-- > 0;)
		for (size_t k = 0; k < fs->dirs[i].info->narch; k++)
			if (strcmp(fs->dirs[i].info->arch[k], arch) == 0 &&
			    strcmp(fs->dirs[i].from, from) == 0 &&
			    strcmp(fs->dirs[i].to, to) == 0)
				return &fs->dirs[i];
	for (size_t i = fs ? fs->ndirs : 0; type && i-- > 0;)
		if (fs->dirs[i].info->model_type &&
		    strcmp(fs->dirs[i].info->model_type, type) == 0 &&
		    strcmp(fs->dirs[i].from, from) == 0 &&
		    strcmp(fs->dirs[i].to, to) == 0)
			return &fs->dirs[i];
	return NULL;
}
