/* inodes: O(1) lookup of (directory, name) in the virtual tree.
 *
 * FUSE inode numbers are tree indexes plus one (the root is FUSE_ROOT_ID).
 * The tree never changes while mounted, so the map is built once and
 * needs no locking.
 */
#ifndef RS_INODES_H
#define RS_INODES_H

#include <stdint.h>

#include "planner/vtree.h"

typedef struct {
	uint32_t *slots;   /* node index + 1; 0 = empty */
	uint64_t mask;
	const rs_vtree *tree;
} rs_inodes;

int rs_inodes_build(rs_inodes *m, const rs_vtree *t);
void rs_inodes_free(rs_inodes *m);

/* Tree index of `name` in directory `dir`, or -ENOENT. */
int rs_inodes_lookup(const rs_inodes *m, uint32_t dir, const char *name,
		     uint32_t *index);

#endif
