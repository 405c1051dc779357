/* Open-file records: see rs_open_file in fs.h. */
#include <stdlib.h>

#include "fs/fs.h"

rs_open_file *rs_open_file_new(rs_fs *fs, uint32_t node)
{
	rs_open_file *of = calloc(1, sizeof(*of));

	if (!of)
		return NULL;
	of->node = node;
	pthread_mutex_lock(&fs->open_lock);
	of->next = fs->open_files;
	if (of->next)
		of->next->prev = of;
	fs->open_files = of;
	pthread_mutex_unlock(&fs->open_lock);
	return of;
}

void rs_open_file_release(rs_fs *fs, rs_open_file *of)
{
	/* Pairs with the release increment at the end of every read. */
	atomic_load_explicit(&of->reads_done, memory_order_acquire);
	pthread_mutex_lock(&fs->open_lock);
	if (of->prev)
		of->prev->next = of->next;
	else
		fs->open_files = of->next;
	if (of->next)
		of->next->prev = of->prev;
	pthread_mutex_unlock(&fs->open_lock);
	free(of->text);
	free(of);
}

void rs_open_files_free_all(rs_fs *fs)
{
	while (fs->open_files)
		rs_open_file_release(fs, fs->open_files);
}
