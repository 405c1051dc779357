/* option_names: the name of every option reshardfs takes - its own -o
 * options (RS_OPTIONS, fs/options.h), its own command-line flags, and the
 * libfuse options it hands on - to tell an unknown option from a known one
 * and to find the known one closest to a mistyped name.
 */
#ifndef RS_OPTION_NAMES_H
#define RS_OPTION_NAMES_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
	RS_OPT_OWN,             /* reshardfs's */
	RS_OPT_FUSE,            /* libfuse's, in its part of --help */
	RS_OPT_MOUNT,           /* libfuse's generic mount options */
} rs_option_from;

typedef struct {
	const char *name;       /* "tp", "allow_other", "--dry-run" */
	const char *arg;        /* shown after "name=" (NULL: a flag) */
	rs_option_from from;
} rs_option_name;

/* Whether name (its first len bytes) is one of reshardfs's own -o
 * options. */
bool rs_option_is_own(const char *name, size_t len);

/* Whether arg, as fuse_opt passes an option that no reshardfs option
 * matched ("name" or "name=value" from -o, "-f" from the command line),
 * is one libfuse takes: the mount options of fuse_session_new and the
 * ones fuse_parse_cmdline reads. */
bool rs_option_is_libfuse(const char *arg);

/* The known option closest to name (len bytes; case aside, at most one
 * edit - an insertion, deletion, substitution or swap of neighbours - per
 * three characters, leading dashes aside): among the -o options when dash
 * is false, among the command-line flags when it is true.  NULL when none
 * is that close. */
const rs_option_name *rs_option_closest(const char *name, size_t len,
					bool dash);

/* Prints the mount options section of --help: the generic mount options,
 * which libfuse's own sections do not list. */
void rs_option_names_help(void);

#endif
