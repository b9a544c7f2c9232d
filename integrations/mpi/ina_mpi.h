/* libina-mpi: MPI_Allreduce / MPI_Iallreduce through INA by PMPI interposition; its query API.
 *
 * Load it with LD_PRELOAD (mpirun -x LD_PRELOAD=.../libina-mpi.so) or link it before libmpi. The
 * program itself needs nothing from this header: these symbols let a test or a tool that knows of
 * INA ask what the interposer did (look them up with dlsym(RTLD_DEFAULT, ...)).
 */
#ifndef INA_MPI_H_
#define INA_MPI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t active;              /* 1 when INA serves supported calls in MPI_COMM_WORLD */
  uint64_t served_blocking;    /* MPI_Allreduce calls INA completed */
  uint64_t served_nonblocking; /* MPI_Iallreduce calls INA completed or has queued */
  uint64_t passed_through;     /* MPI_Allreduce / MPI_Iallreduce calls handed to PMPI */
  uint64_t errors;             /* INA collectives that failed (reported as MPI_ERR_OTHER) */
} ina_mpi_stats_t;

/* This process's counters (valid from MPI_Init until the process exits). */
void ina_mpi_get_stats(ina_mpi_stats_t* out);

#ifdef __cplusplus
}
#endif

#endif /* INA_MPI_H_ */
