/* --dry-run: what the view of SOURCE would be, printed instead of
 * mounted (fs/fs.h).  Everything shown comes from the same checkpoint,
 * layout and tree a mount would serve. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "fs/fs.h"

/* "[a, b, c]" into out. */
static void dims(const uint64_t *v, int n, char *out, size_t size)
{
	size_t at = (size_t)snprintf(out, size, "[");

	for (int i = 0; i < n && at < size; i++)
		at += (size_t)snprintf(out + at, size - at, "%s%" PRIu64,
				       i ? ", " : "", v[i]);
	if (at < size)
		snprintf(out + at, size - at, "]");
}

/* How one tensor is laid out in the view. */
static void tensor_line(const rs_tensor *t, const rs_target *tg, FILE *out)
{
	char shape[RS_MAX_DIMS * 22], chunk[RS_MAX_DIMS * 22];
	const char *how;

	dims(tg->shape, t->ndim, shape, sizeof(shape));
	dims(tg->chunk, t->ndim, chunk, sizeof(chunk));
	if (!tg->has_rule)
		how = "no rule: stored grid kept";
	else if (tg->split == RS_SPLIT_VOCAB)
		how = "split by vocab rows";
	else if (tg->split == RS_SPLIT_AXIS)
		how = "split";
	else
		how = "replicated";
	fprintf(out, "  %s  %s %s  chunks %s  %s", t->name,
		rs_dtype_name(tg->dtype), shape, chunk, how);
	if (tg->has_rule && tg->split != RS_SPLIT_NONE)
		fprintf(out, " along axis %d%s%s", tg->axis,
			tg->by_etp ? " by etp" : "",
			tg->multiplier > 1 ? " (gated: 2 halves per rank)" : "");
	if (tg->expert_axis >= 0)
		fprintf(out, ", experts along axis %d", tg->expert_axis);
	if (tg->dtype != t->dtype)
		fprintf(out, ", from %s", rs_dtype_name(t->dtype));
	fprintf(out, "\n");
}

void rs_fs_dry_run(const rs_fs *fs, bool verbose, FILE *out)
{
	const rs_checkpoint *ck = &fs->ck;
	const rs_layout *l = &fs->layout;
	uint64_t bytes = 0, files = 0, dirs = 0;
	size_t split = 0;

	for (uint32_t i = 1; i < fs->tree.count; i++) {
		if (fs->tree.nodes[i].is_dir) {
			dirs++;
			continue;
		}
		files++;
		bytes += fs->tree.nodes[i].size;
	}
	for (size_t i = 0; i < l->count; i++)
		split += l->targets[i].has_rule &&
			 l->targets[i].split != RS_SPLIT_NONE;
	fprintf(out, "source: %s (%s%s%s)\n", ck->root_path, ck->format->name,
		ck->iter_dir ? ", checkpoint root: iteration " : "",
		ck->iter_dir ? ck->iter_dir : "");
	if (ck->describe)
		fputs(ck->describe, out);
	fprintf(out, "view: %s, tp=%u (stored at tp=%u), pp=%u, vpp=%u, dtype %s\n",
		fs->view_format->name, l->tp, l->src_tp, l->pp, l->vpp,
		l->dtype ? rs_dtype_name(l->dtype) : "as stored");
	if (l->experts)
		fprintf(out, "experts: %llu per MoE layer, ep=%u (%llu local experts per rank), etp=%u (stored at etp=%u)\n",
			(unsigned long long)l->experts, l->ep,
			(unsigned long long)(l->experts / l->ep), l->etp,
			l->src_etp);
	if (ck->facts.heads)
		fprintf(out, "attention: %u heads, %u query groups (%s)\n",
			ck->facts.heads, ck->facts.query_groups, ck->facts.from);
	if (ck->model.family)
		fprintf(out, "family: %s, %s to %s (%s)\n", ck->model.family->name,
			ck->model.family->from, ck->model.family->to,
			ck->model.family->info->path);
	if (ck->model.family && verbose && ck->model.fact_lines)
		fprintf(out, "config facts:\n%s", ck->model.fact_lines);
	fprintf(out, "tensors: %zu (%zu split by tp, %zu whole)\n",
		ck->catalog.count, split, ck->catalog.count - split);
	fprintf(out, "view files: %" PRIu64 " in %" PRIu64 " directories, %" PRIu64 " bytes (%.2f GiB)\n",
		files, dirs, bytes, (double)bytes / (1u << 30));
	if (!verbose)
		return;
	for (size_t i = 0; i < ck->catalog.count; i++)
		tensor_line(&ck->catalog.tensors[i], &l->targets[i], out);
}
