/* reshardfs: mount a training checkpoint as another parallel layout.
 *
 *   reshardfs [options] SOURCE MOUNTPOINT
 *   reshardfs --dry-run [-v] SOURCE [options]
 *
 * Everything that can refuse the mount - options, the checkpoint's
 * metadata, the layout - is checked before anything is mounted, so a bad
 * source fails with its reasons on stderr and leaves no mount behind.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "fs/fs.h"
#include "fs/group.h"
#include "fs/group_lane.h"
#include "fs/log.h"
#include "fs/mountpoint.h"
#include "fs/option_names.h"
#include "fs/options.h"
#include "formats/bridge/bridge.h"

/* Threads that build blocks ahead of sequential readers (fs/prefetch.h). */
#define PREFETCH_THREADS 2

/* Threads that build parts of large snapshots beside their openers
 * (fs/snapshot.h): with -o threads=N, N - 1 (the opener is the Nth);
 * else one per CPU but the opener's, and at least one. */
static unsigned snapshot_threads(unsigned threads)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	if (threads)
		return threads - 1;
	return n > 1 ? (unsigned)(n - 1) : 1;
}

static void usage(const char *prog)
{
	printf("usage: %s [options] SOURCE MOUNTPOINT\n"
	       "       %s --dry-run [-v] SOURCE [-o options]\n\n"
	       "Shows the checkpoint in SOURCE at MOUNTPOINT as though it had been saved\n"
	       "under the requested parallel layout.  Read-only; computed on read.\n"
	       "SOURCE is a checkpoint directory, or a Megatron checkpoint root (its\n"
	       "latest_checkpointed_iteration.txt names the iteration shown).\n\n"
	       "    --dry-run              print what the view would be (format, layout,\n"
	       "                           tensors, files, bytes) and exit: 0, or 1 with\n"
	       "                           the reasons it would be refused\n"
	       "    -v, --verbose          with --dry-run: one line per tensor\n\n",
	       prog, prog);
	rs_options_help();
	printf("FUSE options:\n");
	fuse_cmdline_help();
	fuse_lowlevel_help();
	printf("\n");
	rs_option_names_help();
}

static void print_diag(const rs_diag *d)
{
	size_t n = rs_diag_count(d), shown = 0;

	for (const char *line; (line = rs_diag_line(d, shown)); shown++)
		fprintf(stderr, "reshardfs: %s\n", line);
	if (n > shown)
		fprintf(stderr, "reshardfs: ... and %zu more problems\n", n - shown);
}

static void log_executor(const char *line)
{
	rs_log(RS_LOG_ERROR, "%s", line);
}

/* The tp values (up to 128) at which the layout resolves, as "1, 2, 4",
 * into out; empty when none does. */
static void working_tps(const rs_checkpoint *ck, const rs_rules *rules,
			const rs_layout_opts *lo, char *out, size_t size)
{
	size_t at = 0;

	out[0] = 0;
	for (uint32_t tp = 1; tp <= 128 && at + 8 < size; tp++) {
		rs_layout_opts try = *lo;
		rs_layout l;
		rs_diag *quiet = rs_diag_new();

		try.tp = tp;
		if (quiet && rs_layout_resolve(&ck->catalog, rules, &try, &l,
					       quiet) == 0) {
			at += (size_t)snprintf(out + at, size - at, "%s%u",
					       at ? ", " : "", tp);
			rs_layout_free(&l);
		}
		rs_diag_free(quiet);
	}
}

/* Megatron splits attention by whole heads and whole query groups, and
 * cannot build a model whose tp divides either not: when the checkpoint
 * records them, a view that cuts them is mounted (its bytes are right)
 * with a warning saying which tp values keep them whole. */
static void warn_heads(const rs_checkpoint *ck, const rs_layout *l)
{
	const rs_model_facts *f = &ck->facts;
	char whole[200] = "";
	size_t at = 0;

	if (!f->heads || !f->query_groups ||
	    (f->heads % l->tp == 0 && f->query_groups % l->tp == 0))
		return;
	for (uint32_t tp = 1; tp <= f->query_groups && at + 8 < sizeof(whole); tp++)
		if (f->query_groups % tp == 0 && f->heads % tp == 0)
			at += (size_t)snprintf(whole + at, sizeof(whole) - at,
					       "%s%u", at ? ", " : "", tp);
	fprintf(stderr, "reshardfs: warning: tp=%u cuts the model's %u query groups (%u attention heads, from %s): each rank holds parts of heads, and megatron-core cannot build it; tp values that keep them whole: %s\n",
		l->tp, f->query_groups, f->heads, f->from, whole);
}

/* The checkpoint under another ecosystem's names, when the options ask
 * for it (formats/bridge/bridge.h).  megatron-core pads the vocab of the
 * models it builds: an HF model under its names is padded its way unless
 * -o vocab_size= says otherwise.  (-o vocab_size= with format=hf is the
 * true vocab, which the bridge has used.) */
static int bridge(rs_fs *fs, const rs_options *o, rs_layout_opts *lo,
		  rs_diag *d, char *summary, size_t size)
{
	rs_bridge_opts bo = { fs->view_format, o->names, o->hf_config,
			      o->rules, o->layout.vocab_size,
			      o->hf_experts && strcmp(o->hf_experts, "packed") == 0 };
	int err = rs_bridge_wanted(&fs->ck, &bo, d);

	if (err > 0)
		err = rs_bridge_apply(&fs->ck, &bo, d);
	if (err) {
		snprintf(summary, size, "this %s checkpoint cannot be shown %s",
			 fs->ck.format->name,
			 o->names ? "under megatron-core names"
				  : "as an HF transformers model");
		return err;
	}
	if (o->names && !lo->vocab_size)
		lo->vocab_size = fs->ck.model.vocab;
	/* The hf view's vocab was cut to the true one by the bridge; the
	 * layout must not pad HF's names again. */
	if (strcmp(fs->view_format->name, "hf") == 0)
		lo->vocab_size = 0;
	return 0;
}

/* Catalog, layout and tree; on failure prints why: a one-line summary,
 * then every problem. */
static int build(rs_fs *fs, const rs_options *o)
{
	rs_open_opts open_opts = { .params_file = o->params,
				   .hf_config = o->hf_config,
				   .max_tensors = o->max_tensors,
				   .max_metadata = o->max_metadata };
	rs_layout_opts lo = o->layout;
	rs_rules *rules = NULL;
	rs_diag *d = rs_diag_new();
	char summary[600] = "";
	int err = -ENOMEM;

	if (!d || rs_rules_new(&rules))
		goto out;
	if (o->rules && (err = rs_rules_load_json(rules, o->rules, d))) {
		snprintf(summary, sizeof(summary), "-o rules=%s refused",
			 o->rules);
		goto out;
	}
	open_opts.rules = rules;
	err = rs_checkpoint_open(o->source, &open_opts, &fs->ck, d);
	if (err) {
		snprintf(summary, sizeof(summary), "not a checkpoint reshardfs can read");
		goto out;
	}
	if (fs->ck.notice)
		fprintf(stderr, "reshardfs: note: %s\n", fs->ck.notice);
	fs->view_format = o->view_format ? o->view_format
					 : rs_format_default_view(fs->ck.format);
	/* megatron-core names are for megatron-core's loader: its own
	 * backend unless -o format= says otherwise */
	if (o->names && !o->view_format)
		fs->view_format = rs_format_find_view("torch_dist");
	/* Key forms exist only in per-rank files: elsewhere the option
	 * would do nothing, which a user should hear. */
	if (o->experts_s && strcmp(fs->view_format->name, "megatron") != 0) {
		snprintf(summary, sizeof(summary), "-o experts=%s does not apply",
			 o->experts_s);
		rs_diag_add(d, "-o experts= picks the expert keys of per-rank megatron views; a %s view keys experts as megatron-core's sharded state dict does",
			    fs->view_format->name);
		err = -EINVAL;
		goto out_ck;
	}
	err = bridge(fs, o, &lo, d, summary, sizeof(summary));
	if (err)
		goto out_ck;
	err = rs_layout_resolve(&fs->ck.catalog, rules, &lo, &fs->layout, d);
	if (err) {
		char tps[400];

		working_tps(&fs->ck, rules, &lo, tps, sizeof(tps));
		if (lo.tp)
			snprintf(summary, sizeof(summary),
				 "the layout does not fit this %s checkpoint at tp=%u%s%s",
				 fs->ck.format->name, lo.tp,
				 tps[0] ? "; tp values that work: " : "", tps);
		else
			snprintf(summary, sizeof(summary),
				 "the layout does not fit this %s checkpoint", fs->ck.format->name);
		goto out_ck;
	}
	err = rs_checkpoint_build_view(&fs->ck, fs->view_format, &fs->layout,
				       &fs->tree, d);
	if (err) {
		snprintf(summary, sizeof(summary),
			 "the %s view of this %s checkpoint cannot be built",
			 fs->view_format->name, fs->ck.format->name);
		goto out_tree; /* a partly built tree is freed too */
	}
	warn_heads(&fs->ck, &fs->layout);
	for (size_t i = 0; i < fs->ck.catalog.count; i++)
		if (!fs->layout.targets[i].has_rule)
			rs_log(RS_LOG_DEBUG, "%s: no sharding rule; stored grid kept",
			       fs->ck.catalog.tensors[i].name);
	rs_log(RS_LOG_DEBUG, "%s: %s checkpoint, %zu tensors, source tp=%u, view tp=%u pp=%u, %u files",
	       o->source, fs->ck.format->name, fs->ck.catalog.count,
	       fs->layout.src_tp, fs->layout.tp, fs->layout.pp, fs->tree.count);
	goto out;

out_tree:
	rs_vtree_free(&fs->tree);
	rs_layout_free(&fs->layout);
out_ck:
	rs_checkpoint_close(&fs->ck);
out:
	if (err && summary[0]) {
		size_t n = rs_diag_count(d);

		fprintf(stderr, "reshardfs: %s: refused: %s (%zu problem%s below)\n",
			o->source, summary, n, n == 1 ? "" : "s");
	}
	if (err == -ENOMEM && rs_diag_count(d) == 0)
		fprintf(stderr, "reshardfs: out of memory\n");
	else if (err && rs_diag_count(d) == 0)
		fprintf(stderr, "reshardfs: %s: %s\n", o->source, strerror(-err));
	print_diag(d);
	rs_diag_free(d);
	rs_rules_free(rules);
	return err;
}

static void teardown(rs_fs *fs)
{
	rs_open_files_free_all(fs);
	pthread_mutex_destroy(&fs->open_lock);
	rs_prefetch_stop(fs->prefetch);
	rs_passthrough_free(fs->pt);
	rs_snapshots_free(fs->snapshots);
	/* Unmounted by now, with no reader left, a member still serves its
	 * peers until each is done. */
	if (fs->group)
		rs_group_leave(fs->group);
	rs_cache_free(fs->blocks.cache);
	rs_executor_destroy(fs->blocks.exec);
	rs_vtree_free(&fs->tree);
	rs_layout_free(&fs->layout);
	rs_checkpoint_close(&fs->ck);
}

/* Source files are kept open once read; allow as many as the hard limit. */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* fsname=SOURCE, with the commas and backslashes fuse_opt would split on
 * escaped. */
static int add_fsname(struct fuse_args *args, const char *source)
{
	size_t n = strlen(source);
	char *opt = malloc(2 * n + 16), *p;
	int err;

	if (!opt)
		return -1;
	p = opt + sprintf(opt, "-ofsname=");
	for (const char *s = source; *s; s++) {
		if (*s == ',' || *s == '\\')
			*p++ = '\\';
		*p++ = *s;
	}
	*p = 0;
	err = fuse_opt_add_arg(args, opt);
	free(opt);
	return err;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts cmd = { 0 };
	struct fuse_loop_config *loop = NULL;
	struct fuse_session *se = NULL;
	rs_options o;
	rs_fs fs = { .open_lock = PTHREAD_MUTEX_INITIALIZER };
	rs_diag *d = NULL;
	rs_group_transport *gt = NULL;
	int ret = 1, built;

	if (rs_options_hint(argc, argv) != 0) {
		ret = 2;
		goto out_args;
	}
	if (rs_options_parse(&args, &o) != 0)
		goto out_opts;
	if (fuse_parse_cmdline(&args, &cmd) != 0)
		goto out_opts;
	if (o.show_help || cmd.show_help) {
		usage(argv[0]);
		ret = 0;
		goto out_cmd;
	}
	if (o.show_version || cmd.show_version) {
		printf("reshardfs version %s\nFUSE library version %s\nexecutors: %s\ngroup transports: %s\n",
		       RS_VERSION, fuse_pkgversion(), rs_executor_backends(),
		       !rs_group_mpi_built() ? "none"
		       : rs_group_lane_nccl_available() ? "mpi, nccl"
		       : "mpi");
		ret = 0;
		goto out_cmd;
	}
	if (!o.source || (!cmd.mountpoint && !o.dry_run)) {
		fprintf(stderr, "usage: %s [options] SOURCE MOUNTPOINT, or %s --dry-run [-v] SOURCE [-o options] (see --help)\n",
			argv[0], argv[0]);
		goto out_cmd;
	}
	if (rs_options_validate(&o) != 0)
		goto out_cmd;
	if (!o.dry_run && rs_mountpoint_check(cmd.mountpoint) != 0)
		goto out_cmd;
	/* A group member runs under the job's launcher, which waits on it:
	 * it stays in the foreground. */
	if (o.group && !o.dry_run) {
		cmd.foreground = 1;
		d = rs_diag_new();
		if (!d || rs_group_transport_mpi(&gt, d) != 0) {
			if (d)
				print_diag(d);
			goto out_cmd;
		}
	}
	rs_log_setup(cmd.debug);
	raise_fd_limit();

	built = build(&fs, &o) == 0;
	/* Every member takes part, failed or not, so none waits forever. */
	if (gt && rs_group_agree(gt, built ? fs.ck.sources : NULL,
				 built ? fs.ck.root_path : o.source, d) != 0) {
		print_diag(d);
		gt->finish(gt, true);
		gt = NULL;
		goto out_built;
	}
	if (!built)
		goto out_cmd;
	if (o.dry_run) {
		rs_fs_dry_run(&fs, o.verbose, stdout);
		ret = 0;
		goto out_dry;
	}
	fs.blocks.sources = fs.ck.sources;
	fs.blocks.root_path = fs.ck.root_path;
	if (!d)
		d = rs_diag_new();
	if (!d || rs_executor_probe(&o.exec, d) != 0) {
		if (d)
			print_diag(d);
		else
			fprintf(stderr, "reshardfs: out of memory\n");
		goto out_fs;
	}
	if (rs_cache_new(&fs.blocks.cache, o.cache_size, o.cache_compress) != 0 ||
	    rs_snapshots_new(&fs.snapshots, &fs.blocks, &fs.tree,
			     o.passthrough_max,
			     (rs_snapshot_pages)o.snapshot_pages) != 0 ||
	    rs_passthrough_new(&fs.pt, o.passthrough, &fs.tree, fs.ck.sources,
			       fs.snapshots) != 0) {
		fprintf(stderr, "reshardfs: out of memory\n");
		goto out_fs;
	}
	fs.ctl_ino = (fuse_ino_t)fs.tree.count + 1;
	fs.stats_ino = (fuse_ino_t)fs.tree.count + 2;

	/* Read-only in the kernel too, permission checks by mode bits, and the
	 * source named in /proc/mounts.  Appended last so they win. */
	if (fuse_opt_add_arg(&args, "-oro") ||
	    fuse_opt_add_arg(&args, "-odefault_permissions") ||
	    fuse_opt_add_arg(&args, "-osubtype=reshardfs") ||
	    add_fsname(&args, o.source))
		goto out_fs;

	se = fuse_session_new(&args, &rs_fs_ops, sizeof(rs_fs_ops), &fs);
	if (!se)
		goto out_fs;
	if (fuse_set_signal_handlers(se) != 0)
		goto out_session;
	if (fuse_session_mount(se, cmd.mountpoint) != 0)
		goto out_signals;
	/* Before the loop reads the kernel's INIT. */
	if (rs_passthrough_attach(fs.pt, se) != 0) {
		fprintf(stderr, "reshardfs: cannot hook /dev/fuse for passthrough\n");
		goto out_unmount;
	}
	if (!cmd.foreground)
		rs_log_to_syslog();
	fuse_daemonize(cmd.foreground);

	/* Threads do not survive the fork in fuse_daemonize: start the
	 * executor's pool only now. */
	o.exec.log = log_executor;
	if (rs_executor_create(&fs.blocks.exec, &o.exec, d) != 0) {
		rs_log(RS_LOG_ERROR, "cannot start the executor: %s",
		       rs_diag_line(d, 0) ? rs_diag_line(d, 0) : "out of resources");
		goto out_unmount;
	}
	if (o.exec.kind == RS_EXECUTOR_AUTO) {
		const char *cuda = rs_executor_cuda_status(fs.blocks.exec);

		rs_log(RS_LOG_INFO, "executor=auto: CUDA %s%s", cuda,
		       strcmp(cuda, "ready") == 0
			       ? "" : "; blocks are built on the CPU");
	}
	/* Before any reader: the group becomes the sources' provider.  Its
	 * payloads may go over NCCL, on the executor's first device: under
	 * group_nccl=auto where blocks are built on the GPU (executor=cuda),
	 * under on wherever the executor has a device ready. */
	if (gt) {
		bool cuda = strcmp(rs_executor_cuda_status(fs.blocks.exec),
				   "ready") == 0 &&
			    (o.exec.kind == RS_EXECUTOR_CUDA ||
			     o.group_nccl == RS_GROUP_NCCL_ON);
		int device = !cuda ? -1 : o.exec.ngpus ? o.exec.gpus[0] : 0;
		rs_diag *ld = rs_diag_new();
		rs_group_stats gs;

		if (!ld || rs_group_lane_setup(&gt, (rs_group_nccl_mode)o.group_nccl,
					       device, o.group_timeout_ms, ld) != 0) {
			rs_log(RS_LOG_ERROR, "%s", ld && rs_diag_line(ld, 0)
				       ? rs_diag_line(ld, 0) : "cannot set up the group's NCCL lane");
			rs_diag_free(ld);
			goto out_unmount;
		}
		rs_diag_free(ld);
		if (rs_group_new(&fs.group, gt, fs.ck.sources, o.cache_size,
				 o.group_timeout_ms) != 0) {
			rs_log(RS_LOG_ERROR, "cannot make the group's extent store (out of memory)");
			goto out_unmount;
		}
		gt = NULL;   /* the group's now */
		if (rs_group_start(fs.group) != 0) {
			rs_log(RS_LOG_ERROR, "cannot start the group's threads");
			goto out_unmount;
		}
		rs_group_get_stats(fs.group, &gs);
		rs_log(RS_LOG_INFO, "group=mpi: member %d of %d; extents of %llu MiB",
		       gs.rank, gs.size,
		       (unsigned long long)(RS_GROUP_EXTENT >> 20));
	}
	if (rs_prefetch_start(&fs.prefetch, &fs, PREFETCH_THREADS) != 0)
		rs_log(RS_LOG_ERROR, "cannot start prefetch threads; reading without prefetch");
	if (o.passthrough &&
	    rs_snapshots_start(fs.snapshots, snapshot_threads(o.exec.threads)) != 0)
		rs_log(RS_LOG_ERROR, "cannot start every snapshot build thread; openers build the rest");

	if (cmd.singlethread) {
		ret = fuse_session_loop(se);
	} else {
		loop = fuse_loop_cfg_create();
		if (!loop) {
			ret = 1;
			goto out_unmount;
		}
		fuse_loop_cfg_set_clone_fd(loop, cmd.clone_fd);
		if (cmd.max_idle_threads <= 100000)
			fuse_loop_cfg_set_idle_threads(loop, cmd.max_idle_threads);
		if (cmd.max_threads > 0 && cmd.max_threads <= 100000)
			fuse_loop_cfg_set_max_threads(loop, cmd.max_threads);
		ret = fuse_session_loop_mt(se, loop);
		fuse_loop_cfg_destroy(loop);
	}
	/* libfuse ends the loop on SIGTERM, SIGINT and SIGHUP with the
	 * signal's number as its result: an exit asked for, not a failure. */
	ret = ret != 0 && ret != SIGTERM && ret != SIGINT && ret != SIGHUP;

out_unmount:
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
out_fs:
out_dry:
	teardown(&fs);
	goto out_cmd;
out_built:
	if (built)
		teardown(&fs);
out_cmd:
	if (gt)
		gt->finish(gt, false);
	rs_diag_free(d);
	free(cmd.mountpoint);
out_opts:
	rs_options_free(&o);
out_args:
	fuse_opt_free_args(&args);
	return ret;
}
