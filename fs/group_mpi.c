/* The group's MPI transport (built where CMake finds MPI; see group.h).
 *
 * MPI is used as it is: MPI_COMM_WORLD of the job's launcher (mpirun,
 * srun), point-to-point messages with the group's tags, and one
 * allgather at mount.  One mutex serialises every MPI call
 * (MPI_THREAD_SERIALIZED), and nothing here blocks on a peer: sends are
 * MPI_Isend, kept until MPI_Test finds them done, and arrivals are found
 * with MPI_Improbe.  Errors are returned (MPI_ERRORS_RETURN), not fatal,
 * so a dead peer costs a dropped message, which the group's timeouts
 * cover.
 */
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "fs/group.h"

typedef struct {
	MPI_Request req;
	void *buf;
} pending;

typedef struct {
	rs_group_transport pub;
	pthread_mutex_t lock;
	pending *sends;
	size_t nsends, cap;
} mpi_transport;

/* Sends that are done, freed.  Under the lock. */
static void reap(mpi_transport *m)
{
	size_t n = 0;

	for (size_t i = 0; i < m->nsends; i++) {
		int done = 0;

		if (MPI_Test(&m->sends[i].req, &done, MPI_STATUS_IGNORE) !=
			    MPI_SUCCESS || done) {
			free(m->sends[i].buf);
			continue;
		}
		m->sends[n++] = m->sends[i];
	}
	m->nsends = n;
}

static int mpi_send(rs_group_transport *t, int peer, int tag, void *buf,
		    size_t len)
{
	mpi_transport *m = (mpi_transport *)t;
	int err = 0;

	if (len > (size_t)INT32_MAX) {
		free(buf);
		return -EMSGSIZE;
	}
	pthread_mutex_lock(&m->lock);
	reap(m);
	if (m->nsends == m->cap) {
		size_t cap = m->cap ? 2 * m->cap : 64;
		pending *p = realloc(m->sends, cap * sizeof(*p));

		if (!p) {
			err = -ENOMEM;
			goto out;
		}
		m->sends = p;
		m->cap = cap;
	}
	if (MPI_Isend(buf, (int)len, MPI_BYTE, peer, tag, MPI_COMM_WORLD,
		      &m->sends[m->nsends].req) != MPI_SUCCESS) {
		err = -EIO;
		goto out;
	}
	m->sends[m->nsends++].buf = buf;
	buf = NULL;
out:
	pthread_mutex_unlock(&m->lock);
	free(buf);
	return err;
}

static int mpi_poll(rs_group_transport *t, int *peer, int *tag, void **buf,
		    size_t *len)
{
	mpi_transport *m = (mpi_transport *)t;
	MPI_Message msg;
	MPI_Status st;
	int flag = 0, count = 0, ret = 0;

	pthread_mutex_lock(&m->lock);
	reap(m);
	if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag,
			&msg, &st) != MPI_SUCCESS) {
		ret = -EIO;
		goto out;
	}
	if (!flag)
		goto out;
	MPI_Get_count(&st, MPI_BYTE, &count);
	*buf = malloc(count > 0 ? (size_t)count : 1);
	if (!*buf) {
		/* Received into nothing: the sender's wait times out. */
		char dummy;

		MPI_Mrecv(&dummy, 0, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
		ret = -ENOMEM;
		goto out;
	}
	if (MPI_Mrecv(*buf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE) !=
	    MPI_SUCCESS) {
		free(*buf);
		ret = -EIO;
		goto out;
	}
	*peer = st.MPI_SOURCE;
	*tag = st.MPI_TAG;
	*len = (size_t)count;
	ret = 1;
out:
	pthread_mutex_unlock(&m->lock);
	return ret;
}

static int mpi_allgather(rs_group_transport *t, const void *in, size_t len,
			 void *out)
{
	mpi_transport *m = (mpi_transport *)t;
	int err;

	if (len > (size_t)INT32_MAX)
		return -EMSGSIZE;
	pthread_mutex_lock(&m->lock);
	err = MPI_Allgather(in, (int)len, MPI_BYTE, out, (int)len, MPI_BYTE,
			    MPI_COMM_WORLD);
	pthread_mutex_unlock(&m->lock);
	return err == MPI_SUCCESS ? 0 : -EIO;
}

static void mpi_finish(rs_group_transport *t, bool clean)
{
	mpi_transport *m = (mpi_transport *)t;

	pthread_mutex_lock(&m->lock);
	/* Every peer said goodbye, so what we still send is received;
	 * give it a few seconds. */
	for (int i = 0; clean && m->nsends && i < 5000; i++) {
		pthread_mutex_unlock(&m->lock);
		usleep(1000);
		pthread_mutex_lock(&m->lock);
		reap(m);
	}
	if (clean && !m->nsends)
		MPI_Finalize();
	/* Otherwise a silent peer may never take our sends, and
	 * MPI_Finalize would wait on it: leave without. */
	for (size_t i = 0; i < m->nsends; i++)
		free(m->sends[i].buf);
	pthread_mutex_unlock(&m->lock);
	pthread_mutex_destroy(&m->lock);
	free(m->sends);
	free(m);
}

int rs_group_transport_mpi(rs_group_transport **out, rs_diag *d)
{
	mpi_transport *m = calloc(1, sizeof(*m));
	int provided = 0, rank = 0, size = 0;

	if (!m)
		return -ENOMEM;
	if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) !=
	    MPI_SUCCESS) {
		rs_diag_add(d, "-o group=mpi: MPI_Init_thread failed; start reshardfs under the job's launcher (mpirun, srun)");
		free(m);
		return -EIO;
	}
	if (provided < MPI_THREAD_SERIALIZED) {
		rs_diag_add(d, "-o group=mpi: this MPI library does not allow calls from several threads (MPI_THREAD_SERIALIZED)");
		MPI_Finalize();
		free(m);
		return -ENOTSUP;
	}
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	pthread_mutex_init(&m->lock, NULL);
	m->pub = (rs_group_transport){ "mpi", rank, size, mpi_send, mpi_poll,
				       mpi_allgather, mpi_finish };
	*out = &m->pub;
	return 0;
}

bool rs_group_mpi_built(void)
{
	return true;
}
