#include "planner/source.h"

#include "planner/array.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/openat2.h>
#include <sys/ioctl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
	char *path;
	rs_file_id id;
	_Atomic int fd;          /* -1 until first opened */
} source_file;

struct rs_sources {
	int root;
	source_file *files;
	uint32_t count;
	size_t cap;
	pthread_mutex_t open_lock; /* serialises first opens only */
	_Atomic uint64_t bytes_read;
	const rs_source_provider *provider;
	void *provider_arg;
};

void rs_file_id_from_stat(rs_file_id *id, const struct stat *st)
{
	id->dev = (uint64_t)st->st_dev;
	id->ino = (uint64_t)st->st_ino;
	id->size = (uint64_t)st->st_size;
	id->mtime_sec = st->st_mtim.tv_sec;
	id->mtime_nsec = st->st_mtim.tv_nsec;
	id->ctime_sec = st->st_ctim.tv_sec;
	id->ctime_nsec = st->st_ctim.tv_nsec;
}

static bool same_id(const rs_file_id *a, const rs_file_id *b)
{
	return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
	       a->mtime_sec == b->mtime_sec && a->mtime_nsec == b->mtime_nsec &&
	       a->ctime_sec == b->ctime_sec && a->ctime_nsec == b->ctime_nsec;
}

bool rs_name_is_safe(const char *name)
{
	size_t n = strnlen(name, 256);

	if (n == 0 || n > 255)
		return false;
	if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return false;
	return memchr(name, '/', n) == NULL;
}

int rs_open_beneath(int dirfd, const char *relpath, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC | O_NOCTTY),
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
	};
	long fd = syscall(SYS_openat2, dirfd, relpath, &how, sizeof(how));

	if (fd >= 0)
		return (int)fd;
	if (errno != ENOSYS)
		return -errno;
	/* Old kernel: refuse any '..' and symlinks in the last component. */
	if (strstr(relpath, "..") || relpath[0] == '/')
		return -EXDEV;
	fd = openat(dirfd, relpath, flags | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW);
	return fd >= 0 ? (int)fd : -errno;
}

int rs_sources_open(rs_sources **out, const char *root)
{
	rs_sources *s = calloc(1, sizeof(*s));
	int err;

	if (!s)
		return -ENOMEM;
	s->root = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->root < 0) {
		err = -errno;
		goto fail;
	}
	pthread_mutex_init(&s->open_lock, NULL);
	*out = s;
	return 0;
fail:
	free(s);
	return err;
}

void rs_sources_free(rs_sources *s)
{
	if (!s)
		return;
	for (uint32_t i = 0; i < s->count; i++) {
		if (s->files[i].fd >= 0)
			close(s->files[i].fd);
		free(s->files[i].path);
	}
	free(s->files);
	pthread_mutex_destroy(&s->open_lock);
	close(s->root);
	free(s);
}

int rs_sources_root_fd(const rs_sources *s)
{
	return s->root;
}

int rs_sources_add(rs_sources *s, const char *relpath, const rs_file_id *id,
		   uint32_t *index)
{
	source_file *f;

	int err;

	if (s->count == UINT32_MAX)
		return -E2BIG;
	err = rs_array_reserve(&s->files, &s->cap, (size_t)s->count + 1,
			       sizeof(source_file));
	if (err)
		return err;
	f = &s->files[s->count];
	f->path = strdup(relpath);
	if (!f->path)
		return -ENOMEM;
	f->id = *id;
	atomic_init(&f->fd, -1);
	*index = s->count++;
	return 0;
}

uint32_t rs_sources_count(const rs_sources *s)
{
	return s->count;
}

const char *rs_sources_path(const rs_sources *s, uint32_t index)
{
	return s->files[index].path;
}

const rs_file_id *rs_sources_id(const rs_sources *s, uint32_t index)
{
	return &s->files[index].id;
}

int rs_sources_check(rs_sources *s, uint32_t index)
{
	source_file *f = &s->files[index];
	struct stat st;
	rs_file_id now;

	/* Identities are of the file a path resolves to, as at mount. */
	if (fstatat(s->root, f->path, &st, 0) != 0)
		return -ESTALE;
	rs_file_id_from_stat(&now, &st);
	return same_id(&now, &f->id) ? 0 : -ESTALE;
}

int rs_sources_own_fd(rs_sources *s, uint32_t index, int *fd)
{
	source_file *f = &s->files[index];
	struct stat st;
	rs_file_id now;
	int got = atomic_load(&f->fd), err = 0;

	if (got >= 0) {
		*fd = got;
		return 0;
	}
	pthread_mutex_lock(&s->open_lock);
	got = atomic_load(&f->fd);
	if (got < 0) {
		/* O_NONBLOCK: a FIFO put in a source's place must not block
		 * the daemon; it fails the identity check below. */
		got = rs_open_beneath(s->root, f->path, O_RDONLY | O_NONBLOCK);
		if (got < 0) {
			err = got;
			goto out;
		}
		if (fstat(got, &st) != 0) {
			err = -errno;
			close(got);
			goto out;
		}
		rs_file_id_from_stat(&now, &st);
		if (!same_id(&now, &f->id)) {
			close(got);
			err = -ESTALE;
			goto out;
		}
		atomic_store(&f->fd, got);
	}
	*fd = got;
out:
	pthread_mutex_unlock(&s->open_lock);
	return err;
}

int rs_sources_fd(rs_sources *s, uint32_t index, int *fd)
{
	int err = rs_sources_own_fd(s, index, fd);

	if (err || !s->provider)
		return err;
	err = s->provider->data_fd(s->provider_arg, index);
	if (err < 0)
		return err;
	*fd = err;
	return 0;
}

void rs_sources_set_provider(rs_sources *s, const rs_source_provider *p,
			     void *arg)
{
	s->provider = p;
	s->provider_arg = arg;
}

bool rs_sources_has_provider(const rs_sources *s)
{
	return s->provider != NULL;
}

int rs_sources_acquire(rs_sources *s, uint32_t index, uint64_t off,
		       uint64_t len)
{
	if (!s->provider || len == 0)
		return 0;
	return s->provider->acquire(s->provider_arg, index, off, len);
}

void rs_sources_release(rs_sources *s, uint32_t index, uint64_t off,
			uint64_t len)
{
	if (s->provider && len)
		s->provider->release(s->provider_arg, index, off, len);
}

int rs_sources_verify(rs_sources *s, uint32_t index)
{
	struct stat st;
	rs_file_id now;
	int fd, err = rs_sources_own_fd(s, index, &fd);

	if (err)
		return err;
	if (fstat(fd, &st) != 0)
		return -EIO;
	rs_file_id_from_stat(&now, &st);
	return same_id(&now, &s->files[index].id) ? 0 : -ESTALE;
}

int rs_sources_immutable(rs_sources *s, uint32_t index)
{
	int fd, flags = 0, err = rs_sources_own_fd(s, index, &fd);

	if (err)
		return err;
	if (ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0)
		return errno == ENOTTY || errno == EOPNOTSUPP ? 0 : -errno;
	err = rs_sources_verify(s, index);
	if (err)
		return err;
	return (flags & FS_IMMUTABLE_FL) != 0;
}

int rs_pread_full(int fd, void *dst, uint64_t len, uint64_t off)
{
	uint8_t *p = dst;

	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -EIO;
		p += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

int rs_sources_pread(rs_sources *s, uint32_t index, void *dst, uint64_t len,
		     uint64_t off)
{
	int fd, err = rs_sources_acquire(s, index, off, len);

	if (err)
		return err;
	err = rs_sources_fd(s, index, &fd);
	if (!err)
		err = rs_pread_full(fd, dst, len, off);
	rs_sources_release(s, index, off, len);
	return err;
}

void rs_sources_count_read(rs_sources *s, uint64_t bytes)
{
	atomic_fetch_add_explicit(&s->bytes_read, bytes, memory_order_relaxed);
}

uint64_t rs_sources_bytes_read(const rs_sources *s)
{
	return atomic_load_explicit(&((rs_sources *)s)->bytes_read,
				    memory_order_relaxed);
}
