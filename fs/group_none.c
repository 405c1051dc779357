/* A build without MPI: -o group=mpi is refused, saying what to install
 * (see group.h). */
#include <errno.h>

#include "fs/group.h"

int rs_group_transport_mpi(rs_group_transport **out, rs_diag *d)
{
	(void)out;
	rs_diag_add(d, "-o group=mpi: this reshardfs was built without MPI; install Open MPI (apt install libopenmpi-dev openmpi-bin) and rebuild (scripts/build)");
	return -ENOTSUP;
}

bool rs_group_mpi_built(void)
{
	return false;
}
