/* family: the model families the bridge knows, read from data files -
 * one JSON file per family in share/reshardfs/families/, and the
 * "families" list of a -o rules= file - into rs_family tables
 * (formats/model.h), one per direction the family's rows go.
 *
 * A family file (the whole schema is in reshardfs(1), "FAMILY FILES"):
 *   {"family": "qwen3", "base": "llama",
 *    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
 *    "detect": ["decoder.layers.#.self_attention.q_layernorm.weight"],
 *    "experts": "num_experts",
 *    "embed": {"mcore": "...", "hf": "..."}, "strip": {"mcore": "model."},
 *    "objects": {"mcore": ["decoder.layers.#.<layer>._extra_state", ...]},
 *    "config": [{"hf": "head_dim", "type": "int", "args": "kv_channels",
 *                "shape": "model.layers.#.self_attn.q_proj.weight",
 *                "axis": 0, "per": "num_attention_heads"}, ...],
 *    "checks": [{"args": "normalization", "in": ["RMSNorm"]}, ...],
 *    "names": [{"from": "mcore", "to": "hf", "target": "...",
 *               "op": "same", "sources": ["..."]}, ...]}
 * "base" takes another family's rows (after this one's), facts and checks
 * (this one's replace those of the same field), embed, strip and objects.
 *
 * Every file is hostile input: bounded in size (1 MiB), in rows, facts
 * and checks, its names printable ASCII; anything out of the schema is
 * refused with one line naming the file and the entry.
 *
 * Ownership: rs_families_load's result owns everything in it
 * (rs_families_free, formats/model.h); the rs_family pointers it hands
 * out live as long as it.  Functions return 0, -EINVAL after reporting,
 * or -ENOMEM.
 */
#ifndef RS_FAMILY_H
#define RS_FAMILY_H

#include "formats/model.h"
#include "planner/diag.h"

typedef struct rs_families {
	rs_family_info *infos;
	size_t ninfo;
	rs_family *dirs;                /* one per family and direction */
	size_t ndirs;
	rs_map_row **rows;              /* each dir's rows (owned) */
	char *dir;                      /* where the built-in files were */
	char *list;                     /* "llama, mistral, ..." */
} rs_families;

/* The directory of the built-in family files: next to the daemon
 * (<bin>/../share/reshardfs/families), else where it was installed,
 * else the source tree's; NULL when none exists. */
const char *rs_families_dir(void);

/* Every built-in family file, then the "families" of rules_file (may be
 * NULL; one of the same name replaces a built-in one). */
int rs_families_load(const char *rules_file, rs_families **out, rs_diag *d);

/* Family `name`'s table from ecosystem `from` to `to`, or NULL. */
const rs_family *rs_families_find(const rs_families *fs, const char *name,
				  const char *from, const char *to);

/* The table from `from` to `to` of the family that names architecture
 * `arch` (or, when no family does, whose model_type is `type`; either
 * may be NULL), or NULL.  A rules file's family comes before a built-in
 * one. */
const rs_family *rs_families_by_arch(const rs_families *fs, const char *arch,
				     const char *type, const char *from,
				     const char *to);

#endif
