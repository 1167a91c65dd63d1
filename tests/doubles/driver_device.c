/* The driver double's device memory capacity, per device, private to the process or, with
 * WLTEST_DEVICE_SHM, shared by every process that names the same segment, as one GPU's memory
 * is (device N of every process is one device): out-of-memory then depends on what the other
 * processes hold, and a process's memory is given back when it exits or dies. For tests only. */
#include "driver.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define D drv__state

#define SHM_SLOTS 64

/* One slot per process using the devices: its pid (0 free, -1 being reaped) and its bytes on
 * each device. Device 0's counts lie where the one-device layout had them. */
typedef struct shm_s {
  _Atomic int32_t pid[SHM_SLOTS];
  _Atomic uint64_t used[DRV_MAXDEV][SHM_SLOTS];
} shm_t;

static shm_t *shm;
static int my_slot = -1;

static bool dead(int32_t pid) {
  return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
}

static void slot_clear(int i) {
  for (int d = 0; d < DRV_MAXDEV; d++) atomic_store(&shm->used[d][i], 0);
}

void drv_device_init(void) {
  const char *name = getenv("WLTEST_DEVICE_SHM");
  if (!name) return;
  if (name[0] != '/' || !name[1]) {
    fprintf(stderr,
            "wltest-cuda: WLTEST_DEVICE_SHM=%s is not a shared memory name like "
            "/wltest-gpu; the device is private\n",
            name);
    return;
  }
  int fd = shm_open(name, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  void *p = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, sizeof(shm_t)) == 0)
    p = mmap(NULL, sizeof(shm_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fd >= 0) close(fd);
  if (p == MAP_FAILED) {
    fprintf(stderr, "wltest-cuda: WLTEST_DEVICE_SHM=%s cannot be mapped; the device is private\n",
            name);
    return;
  }
  shm = p;
  int32_t me = (int32_t)getpid();
  for (int i = 0; i < SHM_SLOTS && my_slot < 0; i++) {
    int32_t pid = atomic_load(&shm->pid[i]);
    /* A dead process's slot is taken over: its memory died with it, as on a GPU. */
    if ((pid == 0 || dead(pid)) && atomic_compare_exchange_strong(&shm->pid[i], &pid, me)) {
      slot_clear(i);
      my_slot = i;
    }
  }
  if (my_slot < 0) {
    fprintf(stderr, "wltest-cuda: WLTEST_DEVICE_SHM=%s has no free slot; the device is private\n",
            name);
    munmap(shm, sizeof(shm_t));
    shm = NULL;
  }
}

void drv_device_forked(void) {
  if (shm) munmap(shm, sizeof(shm_t));
  shm = NULL;
  my_slot = -1;
}

/* A clean exit gives the memory back at once; a killed process's is reaped by the others. */
__attribute__((destructor)) static void drv_device_leave(void) {
  if (!shm || my_slot < 0 || atomic_load(&shm->pid[my_slot]) != (int32_t)getpid()) return;
  slot_clear(my_slot);
  atomic_store(&shm->pid[my_slot], 0);
}

static uint64_t shared_total(int dev) {
  uint64_t t = 0;
  for (int i = 0; i < SHM_SLOTS; i++)
    if (atomic_load(&shm->pid[i]) != 0) t += atomic_load(&shm->used[dev][i]);
  return t;
}

static void reap(void) {
  for (int i = 0; i < SHM_SLOTS; i++) {
    int32_t pid = atomic_load(&shm->pid[i]);
    if (!dead(pid) || !atomic_compare_exchange_strong(&shm->pid[i], &pid, -1)) continue;
    slot_clear(i);
    atomic_store(&shm->pid[i], 0);
  }
}

size_t drv_device_used(int dev) {
  return shm ? (size_t)shared_total(dev) : D.used[dev];
}

/* The statistics count this process's bytes, per device and in all. */
static void count(int dev, size_t bytes, bool add) {
  D.used[dev] = add ? D.used[dev] + bytes : D.used[dev] - bytes;
  D.st.device_used[dev] = D.used[dev];
  D.st.used = add ? D.st.used + bytes : D.st.used - bytes;
}

bool drv_charge(int dev, size_t bytes) {
  if (!shm) {
    if (bytes > D.capacity - D.used[dev]) return false;
  } else {
    /* Optimistic: charge, then look; two processes racing for the last bytes may both fail. */
    atomic_fetch_add(&shm->used[dev][my_slot], bytes);
    if (shared_total(dev) > D.capacity) {
      reap();
      if (shared_total(dev) > D.capacity) {
        atomic_fetch_sub(&shm->used[dev][my_slot], bytes);
        return false;
      }
    }
  }
  count(dev, bytes, true);
  return true;
}

void drv_uncharge(int dev, size_t bytes) {
  if (shm) atomic_fetch_sub(&shm->used[dev][my_slot], bytes);
  count(dev, bytes, false);
}
