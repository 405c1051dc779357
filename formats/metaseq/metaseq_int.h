/* metaseq_int: what the metaseq reader's and view's files share; private
 * to them (formats/metaseq/metaseq.h is the module's contract).
 *
 *   read.c    finds and groups the shard files, reads each one's "model"
 *             tensors, shard_metadata and cfg
 *   meta.c    flat-param descriptions from shard_metadata (a pickle) or
 *             from -o params=FILE (JSON)
 *   cfg.c     the model from cfg, cfg's scalars for the view
 *   derive.c  the flat params cfg implies, the check of a params file
 *             against them
 *   interp.c  cfg lookups with OmegaConf's interpolations followed
 *   agree.c   what the files say cross-checked: every file's cfg against
 *             part 0's, the vocab against dict.txt, the position table
 *             against cfg
 *   unflat.c  unflattens each model part's shards
 *   stitch.c  merges the parts into the catalog
 *   view.c    the metaseq view
 *
 * Ownership: each struct owns what it points to; the *_free functions
 * release it (safe on a zeroed struct).
 */
#ifndef RS_METASEQ_INT_H
#define RS_METASEQ_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/checkpoint.h"
#include "formats/codec/pickle.h"
#include "planner/names.h"

/* A tensor of a file's "model" dict. */
typedef struct {
	char *key;
	rs_dtype dtype;
	int ndim;
	uint64_t shape[RS_MAX_DIMS];
	uint64_t stride[RS_MAX_DIMS];   /* elements */
	uint64_t offset;                /* byte offset in the file of its
					 * first element */
} ms_tensor;

/* One param inside a flat param. */
typedef struct {
	char *name;                     /* relative to the flat param's module */
	int ndim;
	uint64_t shape[RS_MAX_DIMS];
	uint64_t numel;
} ms_param;

typedef struct {
	char *key;                      /* "decoder.layers.0.flat_param_0" */
	size_t prefix_len;              /* of the module path in key ("" at
					 * the root: 0) */
	ms_param *params;
	size_t nparams;
	uint64_t total;                 /* sum of numels */
	uint64_t padding;               /* this shard's; meaningful only if
					 * has_padding */
	bool has_padding;               /* false: from params=FILE */
	bool rank0_only;                /* no_broadcast_optim_state: shard
					 * 0 alone holds it */
} ms_flat;

typedef struct {
	char *src, *dst;                /* full state-dict names */
} ms_alias;

typedef struct {
	bool present;                   /* a non-empty description */
	ms_flat *flats;
	size_t nflats;
	char **buffers;
	size_t nbuffers;
	ms_alias *aliases;
	size_t naliases;
} ms_meta;

/* What cfg (or fairseq's args) says of the model (formats/metaseq/cfg.c). */
typedef struct {
	bool present;           /* a cfg with a model section (or args) */
	rs_model_config m;      /* family unset: the reader sets it */
	bool scale_embedding;   /* !no_scale_embedding: embeddings times
				 * sqrt(dim), which HF's OPT does not do */
	bool no_final_norm;     /* cfg's no_decoder_final_norm */
	char arch[64];          /* cfg's _name or arch (cut), for messages */
	/* Set by the reader (formats/metaseq/read.c): whether cfg described
	 * the model, else the one line saying why not - reported only when
	 * something needs cfg (no shard_metadata, the hf view). */
	bool ok;
	char why[640];
} ms_cfg;

typedef struct {
	const char *name;               /* file name (the entry's) */
	uint32_t source;
	uint32_t part, shard;
	ms_tensor *tensors;             /* in stored order */
	size_t ntensors;
	rs_names by_key;                /* the tensors by key */
	ms_meta meta;
	ms_cfg cfg;                     /* every file's (agree.c compares
					 * them) */
	struct ms_state *state;         /* the first file's: for ck->extra */
} ms_file;

/* One scalar of the source's cfg, kept for the metaseq view's cfg. */
typedef enum { MS_CV_NONE, MS_CV_BOOL, MS_CV_INT, MS_CV_FLOAT, MS_CV_STR } ms_cv_kind;

typedef struct {
	char *section;                  /* "model"; NULL at cfg's top */
	char *key;
	ms_cv_kind kind;
	bool b;
	int64_t i;
	double f;
	char *s;
} ms_cv;

/* What the reader keeps in ck->extra for the metaseq view
 * (formats/metaseq/view.c). */
typedef struct ms_state {
	ms_cv *cfg;                     /* cfg's scalars, sections in order */
	size_t ncfg, cap;
	bool fused_qkv;                 /* the parts store qkv_proj */
	bool tied;                      /* output_projection is embed_tokens */
} ms_state;

void ms_state_free(void *state);

/* cfg's scalars (bools, ints, floats, strings, None; of cfg's top and
 * of each section one level down, a DictConfig's or Namespace's alike),
 * or fairseq's args as section "model", appended to st, interpolations
 * resolved as OmegaConf does (one that does not resolve kept as
 * written).  Other values are left out.  0 or -ENOMEM. */
int ms_cfg_copy(const rs_pvalue *top, ms_state *st);

/* The metaseq view (formats/metaseq/view.c). */
int rs_metaseq_build_view(const rs_checkpoint *ck, const rs_layout *l,
			  rs_vtree *t, rs_diag *d);

/* Reads the metaseq checkpoint in ck (ck->sources opened) into its catalog
 * and entries.
 *
 * o->params_file (may be NULL) is used for files without shard_metadata:
 * JSON, either the flat-param map
 *   {"flat_param_0": {"names": [...], "shapes": [[...], ...],
 *                     "numels": [...]},            <- numels optional
 *    "decoder.layers.0.flat_param_0": {...}, ...}
 * keyed by the flat param's state-dict key, names relative to its module
 * path (the key less its last component), in flattening order; or
 * fairscale's shard_metadata itself as JSON ({"param_metadata": [...],
 * "buffer_names": [...]}, "padding" ignored).  Paddings are then those of
 * FSDP's torch.chunk split: shard size ceil(total / D), the padding in
 * the last shards. */
int rs_metaseq_read(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d);

/* The GLOBALs a metaseq checkpoint's data.pkl may name. */
extern const char *const ms_pickle_allow[];

/* A str value without NULs (C code would cut at the first), or NULL. */
const char *ms_whole_str(const rs_pvalue *v);

/* Whether v is a dict or an OrderedDict/defaultdict; *items is then
 * the DICT of its pairs (NULL for an empty OrderedDict: length 0). */
bool ms_dict(const rs_pvalue *v, const rs_pvalue **items);


/* A name that may become a tensor name: rs_name_is_safe and no control
 * bytes. */
bool ms_name_ok(const char *s);

/* shard_metadata `sm` (NULL, None or {} leave m->present false).
 * `where` names the file in messages. */
int ms_meta_from_pickle(const rs_pvalue *sm, const char *where, ms_meta *m,
			rs_diag *d);
/* -o params=FILE. */
int ms_meta_from_json(const char *path, ms_meta *m, rs_diag *d);
void ms_meta_free(ms_meta *m);


/* ---- cfg lookups (formats/metaseq/interp.c) ---------------------------- */

/* Interpolations one lookup follows at most (OmegaConf itself stops at
 * Python's recursion limit: some 60 links by default). */
#define MS_OC_MAX_LINKS 4096u
/* Keys compared (and links checked for a cycle) at most, over all the
 * lookups of one cfg. */
#define MS_OC_MAX_WORK (1u << 24)
#define MS_OC_TOP SIZE_MAX

/* A container of cfg and the place of the container holding it
 * (MS_OC_TOP for cfg itself): what relative interpolations climb. */
typedef struct {
	const rs_pvalue *v;
	size_t up;
} ms_place;

typedef struct {
	ms_place *places;               /* places[0]: cfg's top */
	size_t nplaces, cap;
	struct ms_oc_walk *walks;       /* key paths waiting on a key that
					 * is an interpolation */
	size_t nwalks, wcap;
	struct ms_oc_busy *busy;        /* links being resolved */
	size_t nbusy, bcap;
	uint64_t work;
	char why[320];                  /* what the last -EINVAL was */
} ms_oc;

/* The mapping behind v: a dict or OrderedDict, an argparse.Namespace's
 * state, an OmegaConf DictConfig's _content; NULL for anything else
 * (and for an empty OrderedDict, which holds no field either). */
const rs_pvalue *ms_cfg_map(const rs_pvalue *v);
/* An OmegaConf value node (omegaconf.nodes.AnyNode, IntegerNode, ...)
 * stands for its _val, a DictConfig or ListConfig whose _content is not
 * a container for that; anything else for itself. */
const rs_pvalue *ms_cfg_leaf(const rs_pvalue *v);

/* Lookups in cfg `root` (place 0).  0 or -ENOMEM. */
int ms_oc_init(ms_oc *o, const rs_pvalue *root);
void ms_oc_free(ms_oc *o);
/* A place for container v held by place `up`, into *out. */
int ms_oc_enter(ms_oc *o, const rs_pvalue *v, size_t up, size_t *out);
/* Value v (held by the container at place `up`) resolved as OmegaConf
 * does: *out the value it stands for, *out_up the place of the container
 * holding that.  What OmegaConf refuses (a cycle, a key not found, going
 * above the top, ???, a grammar error), what reshardfs does not evaluate
 * (resolvers, string interpolations) and what passes MS_OC_MAX_LINKS or
 * MS_OC_MAX_WORK is -EINVAL with o->why saying which; -ENOMEM. */
int ms_oc_resolve(ms_oc *o, const rs_pvalue *v, size_t up,
		  const rs_pvalue **out, size_t *out_up);
/* Key `key` of the container at place `at`, resolved (*out NULL when it
 * has no such key); a container value also gets a place, in *place (may
 * be NULL). */
int ms_oc_get(ms_oc *o, size_t at, const char *key, const rs_pvalue **out,
	      size_t *place);

/* ---- the model from cfg (formats/metaseq/cfg.c) ------------------------ */

/* cfg of a parsed data.pkl's top dict `top`: cfg["model"] (a dict, an
 * OmegaConf DictConfig or an argparse.Namespace; its fields, OmegaConf
 * value nodes and interpolations followed as above), then fairseq's
 * top-level args, then cfg's common and distributed_training sections.
 * No cfg leaves c->present false (0).  A field the derivation needs that
 * is missing, of the wrong type or out of range (checked before it
 * narrows), one whose interpolation does not resolve, or a model it
 * cannot describe, is one line naming the field (and the value),
 * -EINVAL. */
int ms_cfg_read(const rs_pvalue *top, const char *where, ms_cfg *c,
		rs_diag *d);

/* Why c does not describe the model, less the "<where>: " its line
 * starts with ("it has none" without a cfg) (formats/metaseq/agree.c). */
const char *ms_cfg_why(const ms_cfg *c, const char *where);

/* ---- the flat params cfg implies (formats/metaseq/derive.c) ------------ */

/* The flat-param description cfg implies for the files f[0..nshards) of
 * model part 0 (docs/FORMATS.md, "Deriving the flat params"): the root's
 * flat_param_0 (embed_tokens, embed_positions, layer_norm, an untied
 * output_projection; the vocab from its size, into c->m.vocab) and each
 * layer's.  Paddings are left to the torch.chunk rule (has_padding
 * false), split over the nparts parts SOURCE holds (cfg's
 * model_parallel_size may be stale).  Refused (one line, -EINVAL): parts
 * that do not divide the sizes, a root flat param no vocab fits, a layer
 * flat param missing, a flat param cfg does not describe. */
int ms_meta_from_cfg(ms_cfg *c, const ms_file *f, size_t nshards,
		     uint32_t nparts, ms_meta *m, const char *where,
		     rs_diag *d);

/* -o params=FILE (`got`, read from `path`) against what cfg implies
 * (`want`): one line naming the flat param and param that differ. */
int ms_meta_check(const ms_meta *want, const ms_meta *got, const char *path,
		  rs_diag *d);

/* "[a, b]" of a shape into out. */
void ms_shape_text(const uint64_t *shape, int ndim, char *out, size_t size);

/* ---- cross-checks (formats/metaseq/agree.c) ---------------------------- */

/* Every file's cfg against the first's: the model facts the derivation
 * and the views take from part 0 (sizes, norms, tie, q/k/v fusion,
 * activation, embedding scale) must be the same; one line naming the
 * file, the field and both values, -EINVAL. */
int ms_cfg_agree(const ms_file *files, size_t n, const char *dir,
		 rs_diag *d);

/* The merged catalog's sizes against the independent ones: the vocab
 * (decoder.embed_tokens.weight's rows) holds dict.txt's symbols when
 * SOURCE has one, an untied output projection has as many rows, and the
 * position table has cfg's max_target_positions + 2 rows.  `f0` is part
 * 0's first file; `derived`: the flat params were derived from cfg (the
 * message then says what a short vocab means).  One line naming both
 * sizes, -EINVAL. */
int ms_check_sizes(rs_checkpoint *ck, const ms_file *f0, bool derived,
		   rs_diag *d);

/* Whether the file holds a flat param (".flat_param_<n>" or
 * "flat_param_<n>"). */
bool ms_holds_flat_key(const ms_file *f);

/* The file's tensor of `key`, or NULL. */
const ms_tensor *ms_file_find(const ms_file *f, const char *key);

/* A tensor of one model part, its fragments in the part's coordinates. */
typedef struct {
	char *name;
	rs_dtype dtype;
	int ndim;
	uint64_t shape[RS_MAX_DIMS];
	rs_fragment *frags;
	size_t nfrags, cap;
} ms_ptensor;

typedef struct {
	ms_ptensor *t;
	size_t n, cap;
	rs_names by_name;
	const ms_file *file;    /* shard 0, named in messages */
	const ms_meta *meta;    /* what unflattened it, or NULL */
} ms_part;

typedef struct {
	rs_checkpoint *ck;
	rs_diag *d;
	char where[4400];       /* "<root>/<file>" of the file at hand */
} ms_ctx;

void ms_set_where(ms_ctx *c, const ms_file *f);

/* Model part p (zeroed) from its shards f[0..nshards) (metaseq_unflat.c):
 * the flat params unflattened by the shards' shard_metadata, else by
 * `params` (-o params=FILE, present false when not given), and every other
 * tensor of shard 0; names checked and indexed. */
int ms_part_build(ms_ctx *c, ms_part *p, const ms_file *f, size_t nshards,
		  const ms_meta *params);
void ms_part_free(ms_part *p);
/* Part p's tensor `name`, or NULL. */
const ms_ptensor *ms_part_find(const ms_part *p, const char *name);

/* Builds the catalog of ck from files[0..n), sorted by part then shard,
 * parts 0..nparts-1 complete.  `params` is -o params=FILE (present false
 * when not given). */
int ms_stitch(rs_checkpoint *ck, const ms_file *files, size_t n,
	      uint32_t nparts, const ms_meta *params, rs_diag *d);

#endif
