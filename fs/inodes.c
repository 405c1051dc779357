#include "fs/inodes.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash(uint32_t dir, const char *name)
{
	uint64_t h = 1469598103934665603ull ^ dir;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	return h ^ (h >> 31);
}

int rs_inodes_build(rs_inodes *m, const rs_vtree *t)
{
	uint64_t size = 16;

	while (size < (uint64_t)t->count * 2)
		size *= 2;
	m->slots = calloc(size, sizeof(uint32_t));
	if (!m->slots)
		return -ENOMEM;
	m->mask = size - 1;
	m->tree = t;
	for (uint32_t i = 1; i < t->count; i++) {
		uint64_t s = hash(t->nodes[i].parent, t->nodes[i].name) & m->mask;

		while (m->slots[s])
			s = (s + 1) & m->mask;
		m->slots[s] = i + 1;
	}
	return 0;
}

void rs_inodes_free(rs_inodes *m)
{
	free(m->slots);
	memset(m, 0, sizeof(*m));
}

int rs_inodes_lookup(const rs_inodes *m, uint32_t dir, const char *name,
		     uint32_t *index)
{
	uint64_t s = hash(dir, name) & m->mask;

	for (; m->slots[s]; s = (s + 1) & m->mask) {
		const rs_vnode *n = &m->tree->nodes[m->slots[s] - 1];

		if (n->parent == dir && strcmp(n->name, name) == 0) {
			*index = m->slots[s] - 1;
			return 0;
		}
	}
	return -ENOENT;
}
