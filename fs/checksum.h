/* checksum: a 64-bit hash of a byte range, for extents that cross the
 * network between group members (fs/group.h).  It catches corruption in
 * transit and a peer's wrong bytes; it is not a cryptographic check.
 * The algorithm is XXH64 (seed 0), so a reply's checksum can be checked
 * with any implementation of it.  Thread safety: pure function. */
#ifndef RS_CHECKSUM_H
#define RS_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

uint64_t rs_checksum64(const void *data, size_t len);

#endif
