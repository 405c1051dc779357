/* mountpoint: MOUNTPOINT checked before reshardfs mounts there.  A mount
 * already there is refused: the view would stack on it and hide it.  A
 * directory with entries is mounted over (libfuse 3 no longer refuses it)
 * with a warning, since its entries are hidden until the unmount.
 */
#ifndef RS_MOUNTPOINT_H
#define RS_MOUNTPOINT_H

/* Prints the refusal or the warning, one line on stderr.  Returns 0, or
 * -EBUSY when path is already a mount point. */
int rs_mountpoint_check(const char *path);

#endif
