/* metaseq cfg lookups as OmegaConf resolves them: the value of a key of
 * a cfg section with "${...}" interpolations followed - absolute paths,
 * relative ones ("${.x}", "${..x}": from the interpolation's own
 * container, wherever it was reached from), keys through intermediate
 * interpolations, list indices - without recursion and with bounded work
 * (docs/FORMATS.md, "Deriving the flat params"). */
#include "formats/metaseq/metaseq_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"

/* Containers entered at most, for one cfg (16 MiB of places): a walk
 * enters one per key, so MS_OC_MAX_WORK alone would allow 16 Mi. */
#define MS_OC_MAX_PLACES (1u << 20)

/* A key path walked, suspended at a key that is itself an interpolation
 * until that one is resolved. */
struct ms_oc_walk {
	const char *s;          /* the interpolation's text */
	size_t at;              /* where its next key starts */
	size_t place;           /* the container reached so far */
	size_t nbusy;           /* links in progress when it was suspended */
};

/* A link being resolved: the value holding the interpolation and its
 * container (one object may sit in two containers of a plain dict). */
struct ms_oc_busy {
	const rs_pvalue *node, *in;
};

static int oc_place(ms_oc *o, const rs_pvalue *v, size_t up, size_t *out);

typedef enum { OC_VALUE, OC_LINK, OC_MISSING, OC_RESOLVER, OC_STRING,
	       OC_SYNTAX } oc_kind;

int ms_oc_init(ms_oc *o, const rs_pvalue *root)
{
	size_t top;

	memset(o, 0, sizeof(*o));
	return oc_place(o, root, MS_OC_TOP, &top);     /* place 0 */
}

void ms_oc_free(ms_oc *o)
{
	free(o->places);
	free(o->walks);
	free(o->busy);
	memset(o, 0, sizeof(*o));
}

/* The list behind v: a list or tuple, a ListConfig's _content. */
static const rs_pvalue *oc_list(const rs_pvalue *v)
{
	if (rs_pv_call_is(v, "omegaconf.listconfig.ListConfig"))
		v = rs_pv_get(rs_pv_state(v), "_content");
	return rs_pv_kind(v) == RS_PV_LIST || rs_pv_kind(v) == RS_PV_TUPLE
	       ? v : NULL;
}

const rs_pvalue *ms_cfg_map(const rs_pvalue *v)
{
	const rs_pvalue *items = NULL, *st;

	if (ms_dict(v, &items))
		return items;
	if (rs_pv_call_is(v, "argparse.Namespace"))
		return ms_dict(rs_pv_state(v), &items) ? items : NULL;
	if (rs_pv_call_is(v, "omegaconf.dictconfig.DictConfig")) {
		st = rs_pv_state(v);
		return ms_dict(rs_pv_get(st, "_content"), &items) ? items
								  : NULL;
	}
	return NULL;
}

const rs_pvalue *ms_cfg_leaf(const rs_pvalue *v)
{
	const char *mod = rs_pv_global_module(rs_pv_func(v));
	const rs_pvalue *c;

	if ((rs_pv_kind(v) == RS_PV_OBJECT || rs_pv_kind(v) == RS_PV_REDUCE) &&
	    mod && strcmp(mod, "omegaconf.nodes") == 0)
		return rs_pv_get(rs_pv_state(v), "_val");
	/* A DictConfig or ListConfig whose _content is None, "???" or an
	 * interpolation stands for that value. */
	if (rs_pv_call_is(v, "omegaconf.dictconfig.DictConfig") ||
	    rs_pv_call_is(v, "omegaconf.listconfig.ListConfig")) {
		c = rs_pv_get(rs_pv_state(v), "_content");
		if (rs_pv_kind(c) == RS_PV_NONE || rs_pv_kind(c) == RS_PV_STR)
			return c;
	}
	return v;
}

static bool oc_container(const rs_pvalue *v)
{
	return ms_cfg_map(v) || oc_list(v) ||
	       /* an empty OrderedDict has no items value */
	       ms_dict(v, &(const rs_pvalue *){ NULL });
}

/* Characters a key may hold in OmegaConf's grammar: anything but
 * \ { } ( ) [ ] : . space tab ' ". */
static bool key_char(char c)
{
	return c && !strchr("\\{}()[]:. \t'\"", c);
}

/* What the string s of a value is to OmegaConf.  A single
 * interpolation ("${" ws? dots? key ((. key) | [key])* ws? "}") is a
 * link; its path (dots and keys) then starts at s[*start]. */
static oc_kind oc_classify(const char *s, size_t len, size_t *start)
{
	const char *in = strstr(s, "${");
	size_t i, j, e;

	if (!in)
		return strcmp(s, "???") == 0 ? OC_MISSING : OC_VALUE;
	if (in != s || s[len - 1] != '}')
		return OC_STRING;
	for (i = 2; s[i] == ' ' || s[i] == '\t'; i++)
		;
	for (e = len - 1; e > i && (s[e - 1] == ' ' || s[e - 1] == '\t'); e--)
		;
	*start = i;
	for (j = i; j < e; j++) {
		if (s[j] == ':')
			return OC_RESOLVER;
		if (s[j] == '$' && s[j + 1] == '{')
			return OC_STRING;
		if (s[j] == '}')
			return OC_STRING;       /* "${a}${b}" */
	}
	/* dots, then a key or [key], then (.key | [key])* */
	while (i < e && s[i] == '.')
		i++;
	for (bool first = true; i < e; first = false) {
		bool br = s[i] == '[';

		if (!first && !br) {
			if (s[i] != '.')
				return OC_SYNTAX;
			i++;
		} else if (br) {
			i++;
		}
		j = i;
		while (i < e && key_char(s[i]))
			i++;
		if (i == j || (br && (i >= e || s[i++] != ']')))
			return OC_SYNTAX;
	}
	return i == e && e > *start && s[e - 1] != '.' ? OC_LINK : OC_SYNTAX;
}

/* Adds a place (container v inside place up); its index in *out. */
static int oc_place(ms_oc *o, const rs_pvalue *v, size_t up, size_t *out)
{
	if (o->nplaces >= MS_OC_MAX_PLACES) {
		snprintf(o->why, sizeof(o->why),
			 "resolving cfg's interpolations enters more than %u containers, a bound of reshardfs",
			 MS_OC_MAX_PLACES);
		return -E2BIG;
	}
	if (rs_array_reserve(&o->places, &o->cap, o->nplaces + 1,
			     sizeof(ms_place)))
		return -ENOMEM;
	o->places[o->nplaces] = (ms_place){ v, up };
	*out = o->nplaces++;
	return 0;
}

int ms_oc_enter(ms_oc *o, const rs_pvalue *v, size_t up, size_t *out)
{
	int err = oc_place(o, v, up, out);

	return err == -E2BIG ? -EINVAL : err;
}

/* Counts work; false (and o->why) past the bound. */
static bool oc_charge(ms_oc *o, uint64_t n)
{
	o->work += n;
	if (o->work <= MS_OC_MAX_WORK)
		return true;
	snprintf(o->why, sizeof(o->why),
		 "resolving cfg's interpolations takes more than %u steps (keys compared), a bound of reshardfs",
		 MS_OC_MAX_WORK);
	return false;
}

/* Child `key` (len bytes) of container c; *out NULL when there is none.
 * A map's last pair of that key wins, as in Python. */
static int oc_child(ms_oc *o, const rs_pvalue *c, const char *key,
		    size_t len, const rs_pvalue **out)
{
	const rs_pvalue *m = ms_cfg_map(c), *l = oc_list(c);
	size_t n = m ? rs_pv_len(m) : 0;

	*out = NULL;
	if (!oc_charge(o, n + 1))
		return -E2BIG;
	for (size_t i = n; i-- > 0;) {
		size_t kl;
		const char *k = rs_pv_str(rs_pv_key(m, i), &kl);

		if (k && kl == len && memcmp(k, key, len) == 0) {
			*out = rs_pv_val(m, i);
			return 0;
		}
	}
	if (l) {
		uint64_t ix = 0;

		if (len > 18)
			return 0;       /* past any list */
		for (size_t i = 0; i < len; i++) {
			if (key[i] < '0' || key[i] > '9') {
				snprintf(o->why, sizeof(o->why),
					 "list index \"%.*s\" is not an int: OmegaConf would refuse it",
					 (int)(len > 40 ? 40 : len), key);
				return -EINVAL;
			}
			ix = ix * 10 + (uint64_t)(key[i] - '0');
		}
		if (ix < rs_pv_len(l))
			*out = rs_pv_item(l, (size_t)ix);
	}
	return 0;
}

/* Is (node in container `in`) a link already being resolved? */
static int oc_busy(ms_oc *o, const rs_pvalue *node, const rs_pvalue *in)
{
	if (!oc_charge(o, o->nbusy + 1))
		return -E2BIG;
	for (size_t i = 0; i < o->nbusy; i++)
		if (o->busy[i].node == node && o->busy[i].in == in)
			return 1;
	if (rs_array_reserve(&o->busy, &o->bcap, o->nbusy + 1,
			     sizeof(*o->busy)))
		return -ENOMEM;
	o->busy[o->nbusy++] = (struct ms_oc_busy){ node, in };
	return 0;
}

/* The why of a refused string s. */
static int oc_refuse(ms_oc *o, oc_kind k, const char *s)
{
	static const char *const what[] = {
		[OC_MISSING] = "is OmegaConf's missing value: OmegaConf would refuse to read it",
		[OC_RESOLVER] = "calls a resolver, which reshardfs does not run (OmegaConf would)",
		[OC_STRING] = "is a string interpolation, an escape or a nested interpolation, which reshardfs does not evaluate (OmegaConf would)",
		[OC_SYNTAX] = "is not an interpolation OmegaConf's grammar parses: OmegaConf would refuse it",
	};

	snprintf(o->why, sizeof(o->why), "%.80s%s %s", s,
		 strlen(s) > 80 ? "..." : "", what[k]);
	return -EINVAL;
}

/* Starts walking link s (its path s[at..end)) held by a value inside
 * place `up`: the place its first key is looked up in. */
static int oc_start(ms_oc *o, const char *s, size_t *at, size_t up,
		    size_t *place)
{
	size_t dots = 0;

	while (s[*at] == '.')
		(*at)++, dots++;
	if (!dots) {
		*place = 0;     /* cfg's top */
		return 0;
	}
	/* one dot: the container holding the interpolation; each more: the
	 * one above */
	for (*place = up; --dots > 0 && *place != MS_OC_TOP;)
		*place = o->places[*place].up;
	if (*place == MS_OC_TOP) {
		snprintf(o->why, sizeof(o->why),
			 "%.80s goes above cfg's top: OmegaConf would refuse it",
			 s);
		return -EINVAL;
	}
	return 0;
}

/* Next key of the walk: [*k, *k + *len); false at the path's end. */
static bool oc_next(const char *s, size_t end, size_t *at, const char **k,
		    size_t *len)
{
	size_t i = *at;

	if (i >= end)
		return false;
	if (s[i] == '.' || s[i] == '[')
		i++;
	*k = s + i;
	for (*len = 0; i < end && key_char(s[i]); i++)
		(*len)++;
	if (i < end && s[i] == ']')
		i++;
	*at = i;
	return true;
}

/* The end of link s's path (before the closing ws and "}"). */
static size_t oc_end(const char *s)
{
	size_t e = strlen(s) - 1;

	while (e > 0 && (s[e - 1] == ' ' || s[e - 1] == '\t'))
		e--;
	return e;
}

int ms_oc_resolve(ms_oc *o, const rs_pvalue *v, size_t up,
		  const rs_pvalue **out, size_t *out_up)
{
	const size_t walks0 = o->nwalks, busy0 = o->nbusy;
	struct ms_oc_walk w = { 0 };
	unsigned links = 0;
	int err = 0;

	for (;;) {
		const rs_pvalue *leaf = ms_cfg_leaf(v), *child;
		size_t len, start = 0, end;
		const char *s = rs_pv_str(leaf, &len), *k;
		oc_kind kind = OC_VALUE;

		if (s && strlen(s) == len && len)
			kind = oc_classify(s, len, &start);
		if (kind != OC_VALUE && kind != OC_LINK) {
			err = oc_refuse(o, kind, s);
			break;
		}
		if (kind == OC_VALUE) {
			if (o->nwalks == walks0) {
				*out = leaf;
				*out_up = up;
				break;
			}
			/* an intermediate key resolved: its walk goes on */
			w = o->walks[--o->nwalks];
			o->nbusy = w.nbusy;
			if (!oc_container(leaf)) {
				snprintf(o->why, sizeof(o->why),
					 "%.80s: a key before the last is not a container: OmegaConf would refuse it",
					 w.s);
				err = -EINVAL;
				break;
			}
			err = oc_place(o, leaf, up, &w.place);
			if (err)
				break;
		} else {
			if (++links > MS_OC_MAX_LINKS) {
				snprintf(o->why, sizeof(o->why),
					 "following it takes more than %u interpolations, a bound of reshardfs",
					 MS_OC_MAX_LINKS);
				err = -E2BIG;
				break;
			}
			err = oc_busy(o, v, up == MS_OC_TOP ? NULL
							 : o->places[up].v);
			if (err == 1) {
				snprintf(o->why, sizeof(o->why),
					 "%.80s leads back to itself: OmegaConf would refuse it (recursive interpolation)",
					 s);
				err = -EINVAL;
			}
			if (err)
				break;
			w = (struct ms_oc_walk){ .s = s, .at = start };
			err = oc_start(o, s, &w.at, up, &w.place);
			if (err)
				break;
		}
		/* walk the keys of w from its place */
		end = oc_end(w.s);
		while (oc_next(w.s, end, &w.at, &k, &len)) {
			const rs_pvalue *c = o->places[w.place].v;

			err = oc_child(o, c, k, len, &child);
			if (err)
				goto out;
			if (!child) {
				snprintf(o->why, sizeof(o->why),
					 "%.80s: no key \"%.*s\" there: OmegaConf would refuse it (interpolation key not found)",
					 w.s, (int)(len > 40 ? 40 : len), k);
				err = -EINVAL;
				goto out;
			}
			if (w.at >= end) {
				v = child;      /* the last key: followed on */
				up = w.place;
				break;
			}
			leaf = ms_cfg_leaf(child);
			if (oc_container(leaf)) {
				err = oc_place(o, leaf, w.place, &w.place);
				if (err)
					goto out;
				continue;
			}
			if (!rs_pv_str(leaf, NULL)) {
				snprintf(o->why, sizeof(o->why),
					 "%.80s: \"%.*s\" is not a container: OmegaConf would refuse it",
					 w.s, (int)(len > 40 ? 40 : len), k);
				err = -EINVAL;
				goto out;
			}
			/* a string: an interpolation (or not) resolved first */
			w.nbusy = o->nbusy;
			if (rs_array_reserve(&o->walks, &o->wcap, o->nwalks + 1,
					     sizeof(w))) {
				err = -ENOMEM;
				goto out;
			}
			o->walks[o->nwalks++] = w;
			v = child;
			up = w.place;
			break;
		}
	}
out:
	o->nwalks = walks0;
	o->nbusy = busy0;
	return err == -E2BIG ? -EINVAL : err;
}

int ms_oc_get(ms_oc *o, size_t at, const char *key, const rs_pvalue **out,
	      size_t *place)
{
	const size_t nplaces = o->nplaces;
	const rs_pvalue *child;
	size_t up;
	int err;

	*out = NULL;
	err = oc_child(o, o->places[at].v, key, strlen(key), &child);
	if (!err && child)
		err = ms_oc_resolve(o, child, at, out, &up);
	if (!err && child && place && oc_container(*out))
		err = oc_place(o, *out, up, place);
	else if (!err)
		o->nplaces = nplaces;   /* no place of this lookup is kept */
	return err == -E2BIG ? -EINVAL : err;
}
