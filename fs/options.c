#include "fs/options.h"

#include "formats/open.h"
#include "fs/group.h"
#include "fs/group_lane.h"
#include "fs/option_names.h"
#include "fs/snapshot.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { KEY_HELP, KEY_VERSION, KEY_GPUS, KEY_DRY_RUN, KEY_VERBOSE };

/* Table entries by kind: STR stores the value in its field; GPUS goes
 * through opt_proc, which joins the list fuse_opt split at its commas. */
#define SPEC_STR(name, field) { name "=%s", offsetof(rs_options, field), 1 },
#define SPEC_GPUS(name, field) FUSE_OPT_KEY(name "=", KEY_GPUS),
#define SPEC(kind, name, field, arg, help) SPEC_##kind(name, field)

static const struct fuse_opt rs_opt_spec[] = {
	RS_OPTIONS(SPEC)
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	FUSE_OPT_KEY("--dry-run", KEY_DRY_RUN),
	FUSE_OPT_KEY("-v", KEY_VERBOSE),
	FUSE_OPT_KEY("--verbose", KEY_VERBOSE),
	FUSE_OPT_END
};

/* "    -o name=ARG" in a column of its own, then the help text, each of
 * its further lines indented to the text's column. */
#define HELP_INDENT 27

static void help_line(const char *name, const char *arg, const char *help)
{
	int n = printf("    -o %s=%s", name, arg);

	printf("%*s", n < HELP_INDENT ? HELP_INDENT - n : 1, "");
	for (const char *p = help;; p++) {
		size_t len = strcspn(p, "\n");

		printf("%.*s\n", (int)len, p);
		p += len;
		if (!*p)
			break;
		printf("%*s", HELP_INDENT, "");
	}
}

#define HELP(kind, name, field, arg, help) help_line(name, arg, help);

void rs_options_help(void)
{
	printf("reshardfs options:\n");
	RS_OPTIONS(HELP)
	printf("\n");
}

/* An option neither reshardfs nor libfuse takes: one line naming it, and
 * the option closest to it when one is close. */
static void unknown_option(const char *arg)
{
	bool dash = arg[0] == '-', flag = false;
	const char *name = arg + strspn(arg, "-"), *eq = strchr(name, '=');
	size_t len = eq ? (size_t)(eq - name) : strlen(name);
	const rs_option_name *k = NULL;

	/* "--dryrun" is a flag; "-tpp=2" and "--allow-other" are -o
	 * options given with dashes */
	if (dash && !eq)
		flag = (k = rs_option_closest(arg, strlen(arg), true)) != NULL;
	if (!k)
		k = rs_option_closest(name, len, false);
	if (!k)
		fprintf(stderr, "reshardfs: %s%s: unknown option; reshardfs --help lists the options\n",
			dash ? "" : "-o ", arg);
	else if (flag)
		fprintf(stderr, "reshardfs: %s: unknown option; did you mean %s?\n",
			arg, k->name);
	else
		fprintf(stderr, "reshardfs: %s%s: unknown option; did you mean -o %s%s%s?\n",
			dash ? "" : "-o ", arg, k->name, k->arg ? "=" : "",
			!k->arg ? "" : eq && eq[1] ? eq + 1 : k->arg);
}

static int opt_proc(void *data, const char *arg, int key,
		    struct fuse_args *outargs)
{
	rs_options *o = data;

	/* fuse_opt splits -o at commas, so "gpus=0,1,3" arrives as "gpus=0",
	 * "1", "3": bare numbers right after it continue the list. */
	if (key == FUSE_OPT_KEY_OPT && o->in_gpus && *arg &&
	    strspn(arg, "0123456789") == strlen(arg)) {
		char *more;

		if (asprintf(&more, "%s,%s", o->gpus_s, arg) < 0)
			return -1;
		free(o->gpus_s);
		o->gpus_s = more;
		return 0;
	}
	o->in_gpus = false;
	switch (key) {
	case KEY_GPUS:
		free(o->gpus_s);
		o->gpus_s = strdup(arg + strlen("gpus="));
		o->in_gpus = true;
		return o->gpus_s ? 0 : -1;
	case FUSE_OPT_KEY_NONOPT:
		if (!o->source) {
			o->source = strdup(arg);
			return 0;
		}
		return 1; /* the mountpoint, for fuse_parse_cmdline */
	case KEY_HELP:
		o->show_help = true;
		return 1; /* libfuse prints its part too */
	case KEY_VERSION:
		o->show_version = true;
		return 1;
	case KEY_DRY_RUN:
		o->dry_run = true;
		return 0;
	case KEY_VERBOSE:
		o->verbose = true;
		return 0;
	default:
		/* "-o tp=2," leaves an empty one, which libfuse takes in some
		 * places and not in others (mount.fuse3 drops it too). */
		if (!*arg)
			return 0;
		/* Refused here, not by fuse_session_new: a dry run never
		 * reaches libfuse, and libfuse's line names no option meant. */
		if (!rs_option_is_libfuse(arg)) {
			unknown_option(arg);
			o->unknown = true;
			return 0;
		}
		return 1;
	}
}

int rs_options_hint(int argc, char *argv[])
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *eq;
		const char *name = a, *value = NULL;

		if (strcmp(a, "-o") == 0) {
			i++;            /* its value is -o's own */
			continue;
		}
		if (strncmp(a, "-o", 2) == 0)
			continue;       /* -oOPTS, fuse_opt's joined form */
		if (a[0] == '-') {      /* --tp 8, --tp=8, -tp=8 */
			name = a + (a[1] == '-' ? 2 : 1);
			eq = strchr(name, '=');
			value = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : "VALUE");
		} else if (!(eq = strchr(a, '=')) || access(a, F_OK) == 0) {
			continue;       /* a path */
		} else {
			value = eq + 1;
		}
		eq = strchr(name, '=');
		if (!rs_option_is_own(name, eq ? (size_t)(eq - name)
					       : strlen(name)))
			continue;
		fprintf(stderr, "reshardfs: %s: did you mean -o %.*s=%s?\n", a,
			(int)(eq ? (size_t)(eq - name) : strlen(name)), name,
			value);
		return -1;
	}
	return 0;
}

int rs_options_parse(struct fuse_args *args, rs_options *o)
{
	memset(o, 0, sizeof(*o));
	if (fuse_opt_parse(args, o, rs_opt_spec, opt_proc) != 0)
		return -1;
	return o->unknown ? -1 : 0;
}

/* Strict decimal: digits only, no sign, no overflow. */
static int parse_u64(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

static int parse_count(const char *name, const char *s, uint32_t *out)
{
	uint64_t v;

	if (!s)
		return 0;
	if (parse_u64(s, &v) || v == 0 || v > 1u << 20) {
		fprintf(stderr, "reshardfs: -o %s=%s: must be an integer from 1 to %u\n",
			name, s, 1u << 20);
		return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

/* "123", "64K", "512M", "2G" (powers of 1024). */
static int parse_size(const char *s, uint64_t *out)
{
	char digits[32];
	size_t n = strlen(s);
	unsigned shift = 0;
	uint64_t v;

	if (n == 0 || n >= sizeof(digits))
		return -EINVAL;
	memcpy(digits, s, n + 1);
	switch (digits[n - 1]) {
	case 'k': case 'K': shift = 10; break;
	case 'm': case 'M': shift = 20; break;
	case 'g': case 'G': shift = 30; break;
	case 't': case 'T': shift = 40; break;
	}
	if (shift)
		digits[n - 1] = 0;
	if (parse_u64(digits, &v) || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*out = v << shift;
	return 0;
}

/* The words of the options that take one of a few, in the order of the
 * values they stand for (the first is the default where one is). */
static const char *const executor_words[] = { "auto", "cpu", "cuda", NULL };
static const char *const group_nccl_words[] = { "auto", "on", "off", NULL };
static const char *const snapshot_pages_words[] = { "auto", "huge", "small",
						    NULL };
static const char *const passthrough_words[] = { "auto", "off", NULL };
static const char *const cache_compress_words[] = { "lz4", "none", NULL };

/* -o name=value where value is one of words: *out = its index, 0.  An
 * absent value leaves *out.  Otherwise -1, after the line "must be A, B
 * or C". */
static int keyword(const char *name, const char *value,
		   const char *const *words, int *out)
{
	char list[128] = "";
	size_t at = 0;
	int n = 0;

	if (!value)
		return 0;
	for (; words[n]; n++)
		if (strcmp(value, words[n]) == 0) {
			*out = n;
			return 0;
		}
	for (int i = 0; i < n && at < sizeof(list); i++)
		at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%s",
				       i == 0 ? "" : i == n - 1 ? " or " : ", ",
				       words[i]);
	fprintf(stderr, "reshardfs: -o %s=%s: must be %s\n", name, value, list);
	return -1;
}

/* "0,1,3": distinct device ordinals. */
static int parse_gpus(const char *s, rs_executor_opts *e)
{
	char *copy = strdup(s), *save = NULL;
	int err = copy ? 0 : -ENOMEM;

	e->ngpus = 0;
	for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok && !err;
	     tok = strtok_r(NULL, ",", &save)) {
		uint64_t v;

		if (parse_u64(tok, &v) || v > 255 || e->ngpus == RS_MAX_GPUS) {
			err = -EINVAL;
			break;
		}
		for (unsigned i = 0; i < e->ngpus; i++)
			if (e->gpus[i] == (int)v)
				err = -EINVAL;
		e->gpus[e->ngpus++] = (int)v;
	}
	if (!err && e->ngpus == 0)
		err = -EINVAL;
	free(copy);
	return err;
}

static int validate_exec(rs_options *o)
{
	rs_executor_opts *e = &o->exec;
	uint64_t v;
	int bad = 0, kind;

	if (o->dtype_s) {
		o->layout.dtype = rs_dtype_from_option(o->dtype_s);
		if (o->layout.dtype == RS_DTYPE_INVALID) {
			fprintf(stderr, "reshardfs: -o dtype=%s: must be bf16, f16 or f32\n",
				o->dtype_s);
			bad = -1;
		}
	}
	kind = RS_EXECUTOR_AUTO;
	bad |= keyword("executor", o->executor_s, executor_words, &kind);
	e->kind = (rs_executor_kind)kind;
	if (o->threads_s) {
		if (parse_u64(o->threads_s, &v) || v < 1 || v > RS_MAX_THREADS) {
			fprintf(stderr, "reshardfs: -o threads=%s: must be an integer from 1 to %d\n",
				o->threads_s, RS_MAX_THREADS);
			bad = -1;
		} else {
			e->threads = (unsigned)v;
		}
	}
	if (o->gpus_s && parse_gpus(o->gpus_s, e)) {
		fprintf(stderr, "reshardfs: -o gpus=%s: must be distinct device numbers (0-255), at most %d, separated by commas\n",
			o->gpus_s, RS_MAX_GPUS);
		bad = -1;
	}
	if (o->gpu_mem_s) {
		if (parse_size(o->gpu_mem_s, &v) || v < (1u << 20)) {
			fprintf(stderr, "reshardfs: -o gpu_mem=%s: must be a size of at least 1M (bytes, or with K, M, G, T)\n",
				o->gpu_mem_s);
			bad = -1;
		} else {
			e->gpu_mem = v;
		}
	}
	if (e->kind == RS_EXECUTOR_CPU && (o->gpus_s || o->gpu_mem_s)) {
		fprintf(stderr, "reshardfs: -o %s: needs executor=auto or executor=cuda, not cpu\n",
			o->gpus_s ? "gpus" : "gpu_mem");
		bad = -1;
	}
	return bad;
}

/* An option that only a group takes, given without one: -1. */
static int needs_group(const char *name, const char *value)
{
	fprintf(stderr, "reshardfs: -o %s=%s: needs -o group=mpi\n", name,
		value);
	return -1;
}

/* group=, group_timeout= and group_nccl=. */
static int validate_group(rs_options *o)
{
	char *end = NULL;
	double secs;
	int bad = 0;

	o->group_timeout_ms = RS_GROUP_DEFAULT_TIMEOUT_MS;
	if (o->group_s) {
		if (strcmp(o->group_s, "mpi") == 0) {
			o->group = true;
		} else {
			fprintf(stderr, "reshardfs: -o group=%s: must be mpi\n",
				o->group_s);
			bad = -1;
		}
	}
	if (o->group_timeout_s) {
		errno = 0;
		secs = strtod(o->group_timeout_s, &end);
		if (errno || end == o->group_timeout_s || *end ||
		    !(secs >= 0.01 && secs <= 3600)) {
			fprintf(stderr, "reshardfs: -o group_timeout=%s: must be seconds from 0.01 to 3600\n",
				o->group_timeout_s);
			bad = -1;
		} else if (!o->group_s) {
			bad = needs_group("group_timeout", o->group_timeout_s);
		} else {
			o->group_timeout_ms = (unsigned)(secs * 1000 + 0.5);
		}
	}
	o->group_nccl = RS_GROUP_NCCL_AUTO;
	if (keyword("group_nccl", o->group_nccl_s, group_nccl_words,
		    &o->group_nccl))
		return -1;
	if (o->group_nccl_s && !o->group_s)
		bad = needs_group("group_nccl", o->group_nccl_s);
	return bad;
}

int rs_options_validate(rs_options *o)
{
	int bad = 0, word;
	uint64_t v;

	bad |= parse_count("tp", o->tp_s, &o->layout.tp);
	bad |= parse_count("pp", o->pp_s, &o->layout.pp);
	bad |= parse_count("vpp", o->vpp_s, &o->layout.vpp);
	bad |= parse_count("ep", o->ep_s, &o->layout.ep);
	bad |= parse_count("etp", o->etp_s, &o->layout.etp);
	bad |= parse_count("src_tp", o->src_tp_s, &o->layout.src_tp);
	bad |= parse_count("vocab_divisor", o->vocab_divisor_s,
			   &o->layout.vocab_divisor);
	if (o->vocab_size_s) {
		if (parse_u64(o->vocab_size_s, &v) || v == 0 || v > (1ull << 40)) {
			fprintf(stderr, "reshardfs: -o vocab_size=%s: must be a positive integer\n",
				o->vocab_size_s);
			bad = -1;
		} else {
			o->layout.vocab_size = v;
		}
	}
	/* Read later, by whichever reader needs them: a FIFO or a device
	 * there would block the mount, so they must be regular files. */
	for (int i = 0; i < 3; i++) {
		static const char *const opt[] = { "rules", "params", "hf_config" };
		const char *path = i == 0 ? o->rules : i == 1 ? o->params
							     : o->hf_config;
		struct stat st;

		/* (one that cannot be stat'ed is reported by its reader) */
		if (path && stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
			fprintf(stderr, "reshardfs: -o %s=%s: must be a regular file\n",
				opt[i], path);
			bad = -1;
		}
	}
	if (o->hf_experts && strcmp(o->hf_experts, "per_expert") &&
	    strcmp(o->hf_experts, "packed")) {
		fprintf(stderr, "reshardfs: -o hf_experts=%s: must be per_expert or packed\n",
			o->hf_experts);
		return -EINVAL;
	}
	if (o->experts_s) {
		if (strcmp(o->experts_s, "sequential") == 0)
			o->layout.expert_keys = RS_EXPERT_KEYS_SEQUENTIAL;
		else if (strcmp(o->experts_s, "grouped") == 0)
			o->layout.expert_keys = RS_EXPERT_KEYS_GROUPED;
		else {
			fprintf(stderr, "reshardfs: -o experts=%s: must be sequential or grouped\n",
				o->experts_s);
			bad = -1;
		}
	}
	if (o->names && strcmp(o->names, "mcore") != 0) {
		fprintf(stderr, "reshardfs: -o names=%s: must be mcore\n", o->names);
		bad = -1;
	}
	if (o->shard_size_s &&
	    (parse_size(o->shard_size_s, &o->layout.shard_size) ||
	     o->layout.shard_size < 1024)) {
		fprintf(stderr, "reshardfs: -o shard_size=%s: must be a size of at least 1K (bytes, or with K, M, G, T)\n",
			o->shard_size_s);
		bad = -1;
	}
	if (o->max_tensors_s &&
	    (parse_u64(o->max_tensors_s, &o->max_tensors) || !o->max_tensors)) {
		fprintf(stderr, "reshardfs: -o max_tensors=%s: must be a positive integer\n",
			o->max_tensors_s);
		bad = -1;
	}
	if (o->max_metadata_s &&
	    (parse_size(o->max_metadata_s, &o->max_metadata) ||
	     o->max_metadata < (1u << 20))) {
		fprintf(stderr, "reshardfs: -o max_metadata=%s: must be a size of at least 1M (bytes, or with K, M, G, T)\n",
			o->max_metadata_s);
		bad = -1;
	}
	o->cache_size = RS_DEFAULT_CACHE_SIZE;
	if (o->cache_size_s) {
		if (parse_size(o->cache_size_s, &v) || v < (1u << 20)) {
			fprintf(stderr, "reshardfs: -o cache_size=%s: must be a size of at least 1M (bytes, or with K, M, G, T)\n",
				o->cache_size_s);
			bad = -1;
		} else {
			o->cache_size = v;
		}
	}
	word = 0;
	bad |= keyword("passthrough", o->passthrough_s, passthrough_words,
		       &word);
	o->passthrough = word == 0;
	o->snapshot_pages = RS_PAGES_AUTO;
	bad |= keyword("snapshot_pages", o->snapshot_pages_s,
		       snapshot_pages_words, &o->snapshot_pages);
	o->passthrough_max = o->cache_size / 4;
	if (o->passthrough_max_s) {
		if (parse_size(o->passthrough_max_s, &v)) {
			fprintf(stderr, "reshardfs: -o passthrough_max=%s: must be a size (bytes, or with K, M, G, T)\n",
				o->passthrough_max_s);
			bad = -1;
		} else if (v > o->cache_size) {
			fprintf(stderr, "reshardfs: -o passthrough_max=%s: must be at most cache_size (%llu bytes): snapshots are held in the cache's budget\n",
				o->passthrough_max_s, (unsigned long long)o->cache_size);
			bad = -1;
		} else {
			o->passthrough_max = v;
		}
	}
	if (o->format_s) {
		o->view_format = rs_format_find_view(o->format_s);
		if (!o->view_format) {
			char names[128];

			rs_format_view_names(names, sizeof(names));
			fprintf(stderr, "reshardfs: -o format=%s: must be %s\n",
				o->format_s, names);
			bad = -1;
		}
	}
	word = 1;
	bad |= keyword("cache_compress", o->cache_compress_s,
		       cache_compress_words, &word);
	o->cache_compress = word == 0;
	bad |= validate_exec(o);
	bad |= validate_group(o);
	return bad ? -1 : 0;
}

#define FREE(kind, name, field, arg, help) free(o->field);

void rs_options_free(rs_options *o)
{
	free(o->source);
	RS_OPTIONS(FREE)
	memset(o, 0, sizeof(*o));
}
