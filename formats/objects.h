/* objects: ShardedObjects (byte items) moved between backends.
 *
 * Megatron stores a ShardedObject as a torch.save of the object in the
 * zarr backend (`<key>/shard_<...>.pt`), but as a torch.save of a
 * one-element list [object] in torch_dist.  A view of the other backend
 * must re-wrap it: rs_object_append writes the object's torch.save zip
 * with data.pkl wrapped into (or unwrapped from) that list, and every other
 * record served from the source as it is (CRCs from the source's central
 * directory, so the zip checks out).
 *
 * Unwrapping needs data.pkl to be Python's pickle of a one-element list
 * (PROTO 2, EMPTY_LIST, BINPUT 0, the object, APPEND, STOP) - which
 * torch.save writes.  Anything else is refused with -EINVAL and a line
 * naming the item, never passed through in the wrong form.
 */
#ifndef RS_OBJECTS_H
#define RS_OBJECTS_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/checkpoint.h"

/* Appends blob `b` to `file`, as a list item (`as_list`) or a bare object,
 * converting when b->listed differs.  *length receives the bytes added. */
int rs_object_append(const rs_checkpoint *ck, const rs_blob *b, bool as_list,
		     rs_vtree *t, uint32_t file, uint64_t *length, rs_diag *d);

#endif
