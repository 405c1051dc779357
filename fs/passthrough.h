/* passthrough: view files the kernel reads without the daemon.
 *
 * Linux >= 6.9 lets a FUSE server hand an open file to a backing file
 * (FUSE passthrough): reads and mmap of that open file are then served by
 * the kernel from the backing file, and never reach the daemon.  libfuse
 * 3.14 has no API for it, so this module sits between libfuse and
 * /dev/fuse (fuse_session_custom_io): it reads the kernel's INIT request
 * for the offer, patches FUSE_PASSTHROUGH and a stack depth into libfuse's
 * INIT reply, and patches FOPEN_PASSTHROUGH and a backing id into the
 * OPEN replies it chose (protocol: fs/fuse_abi.h).
 *
 * Which file goes which way, decided at the first open of the file (an
 * inode cannot be open both ways at once, so later opens join the way its
 * open files already go, until the last of them is released):
 *   source   a view file whose bytes are one whole source file, when that
 *            file is immutable (chattr +i) and unchanged since the mount:
 *            passed through to the source file itself;
 *   snapshot any other view file of at most max_size bytes: built into an
 *            unchangeable in-memory snapshot (fs/snapshot.h), reused by
 *            later opens while it is held;
 *   read     the read path of fs/read.c: with -o passthrough=off, when
 *            the kernel does not offer passthrough or the daemon lacks
 *            CAP_SYS_ADMIN, for files over max_size, when the cache budget
 *            is full of open files' bytes, when the build or the backing
 *            registration fails, while the file is open on the read path
 *            already, and for a file an earlier open read on the read
 *            path: the kernel keeps the pages it read (keep_cache), and
 *            reading them again measured 2.5-3.9 times faster than
 *            building a snapshot of the file to read instead
 *            (BENCHMARKS.md, "Which way an open goes").
 * A first open goes to a snapshot rather than the read path because that
 * measured faster with 16 readers on a 16-core machine, cold (1.2-2.1
 * times) and warm, and about even on 2 cores; with 1-4 readers of many
 * small files the read path won, a case this rule does not yet tell
 * apart (BENCHMARKS.md, same section).
 * Why a raw passthrough to a source that can change is never used: the
 * kernel would read whatever the file holds at the time, so a rewrite in
 * place would show foreign bytes and a truncation short reads, where every
 * other read gives EIO (SECURITY.md).
 *
 * A backing id stays registered while any open file uses it (closing it
 * earlier races the kernel's processing of the OPEN reply) and is closed
 * at the file's last release; a snapshot outlives it, idle, until the
 * cache needs its bytes.
 *
 * Thread safety: every function may be called from any thread, after
 * rs_passthrough_new and before rs_passthrough_free. */
#ifndef RS_PASSTHROUGH_H
#define RS_PASSTHROUGH_H

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stdint.h>

#include "fs/snapshot.h"

typedef struct rs_passthrough rs_passthrough;

typedef enum {
	RS_OPEN_READ,            /* the daemon's read path */
	RS_OPEN_SNAPSHOT,        /* passthrough to a snapshot (fs/snapshot.h) */
	RS_OPEN_SOURCE,          /* passthrough to an immutable source file */
	RS_OPEN_KINDS
} rs_open_kind;

/* How one open file is served; part of its open-file record. */
typedef struct {
	rs_open_kind kind;
	int32_t backing_id;      /* for the OPEN reply, when not READ */
} rs_pt_open;

/* `enabled`: -o passthrough=auto (else off: the session is left as
 * libfuse made it).  The tree, sources and snapshot store are borrowed. */
int rs_passthrough_new(rs_passthrough **out, bool enabled,
		       const rs_vtree *tree, rs_sources *sources,
		       rs_snapshots *snapshots);
void rs_passthrough_free(rs_passthrough *p);

/* Installs the /dev/fuse hooks on a mounted session, before its loop
 * runs (the INIT request is read by the loop).  A no-op when disabled. */
int rs_passthrough_attach(rs_passthrough *p, struct fuse_session *se);

/* Chooses how the open of view file `node` about to be replied is served
 * and takes what it needs (a snapshot, a backing id).  Never fails: the
 * read path is the fallback.  Every call is paired with one
 * rs_passthrough_close. */
void rs_passthrough_open(rs_passthrough *p, uint32_t node, rs_pt_open *o);
void rs_passthrough_close(rs_passthrough *p, uint32_t node, rs_pt_open *o);

/* Brackets fuse_reply_open on the replying thread: between them, the
 * OPEN reply carrying file handle `fh` is patched for `o`. */
void rs_passthrough_reply_begin(const rs_pt_open *o, uint64_t fh);
void rs_passthrough_reply_end(void);

/* A source of `node` changed: its idle snapshot is dropped. */
void rs_passthrough_forget(rs_passthrough *p, uint32_t node);

/* The "passthrough" object of the stats file (malloc'd JSON text). */
char *rs_passthrough_stats_json(rs_passthrough *p);

#endif
