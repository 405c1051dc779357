/* Jobs cut into pieces for backends' threads (gpu/backend.h). */
#include "gpu/backend.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "planner/array.h"

static int add_piece(rs_exec_job *job, size_t *cap, rs_exec_piece p)
{
	int err = rs_array_reserve(&job->pieces, cap, job->npieces + 1,
				   sizeof(p));

	if (!err)
		job->pieces[job->npieces++] = p;
	return err;
}

int rs_exec_job_split(rs_exec_job *job, uint64_t max_bytes)
{
	size_t cap = 0;
	int err = 0;

	job->pieces = NULL;
	job->npieces = 0;
	atomic_store(&job->next_piece, 0);
	for (size_t i = 0; i < job->nops && !err; i++) {
		const rs_copy_op *op = &job->ops[i];

		if (op->count == 1) {
			for (uint64_t b = 0; b < op->len && !err; b += max_bytes) {
				rs_exec_piece p = { (uint32_t)i, 0, 1, b,
						    op->len - b < max_bytes ? op->len - b : max_bytes };
				err = add_piece(job, &cap, p);
			}
			continue;
		}
		uint64_t per = op->len >= max_bytes ? 1 : max_bytes / op->len;

		for (uint64_t r = 0; r < op->count && !err; r += per) {
			rs_exec_piece p = { (uint32_t)i, r,
					    op->count - r < per ? op->count - r : per,
					    0, op->len };
			err = add_piece(job, &cap, p);
		}
	}
	if (err) {
		rs_exec_job_release(job);
		job->npieces = 0;
	}
	atomic_store(&job->finished, 0);
	atomic_store(&job->status, 0);
	return err;
}

void rs_exec_job_release(rs_exec_job *job)
{
	/* npieces stays: a helper thread may still compare next_piece with it
	 * (finding nothing left to claim). */
	free(job->pieces);
	job->pieces = NULL;
}
