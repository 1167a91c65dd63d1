# The cuda backend's colocate and ticktock under LD_PRELOAD=libwavelet.so, on the CUDA test
# doubles (tests/doubles): plumbing only. The doubles' kernels have no host twins here, so they
# do nothing: losses and accuracies are meaningless and not looked at.
# - ticktock, 2 replicas of the residual CNN at batch 128, under a budget below two replicas'
#   peaks: both finish, each replica's interposer trace has a gate grant (token span) per step,
#   and no two token spans overlap (wb-token-spans reads the traces with libwltrace's reader);
#   the gate's wait, the combined peak and the rising phases' overlap come from those traces,
#   so do the memory waits (BUDGET_WAIT events) and the combined physical peak (MAP/UNMAP, within
#   the limit); without --trace-dir both waits are "not measured" (null);
# - colocate (alloc mode, no waiting for the budget) under the same budget: a replica reports out
#   of memory cleanly (the interposer refused its cudaMallocAsync);
# - single with --preload: alloc mode, never gated, its physical peak from its trace, and what
#   a tick-tock pair of it needs (its wave folded by its markers' iterations);
# - a --preload that is missing or is not libwavelet.so: one line naming it, exit 2.
# Usage: cmake -DBENCH=path -DPRELOAD=libwavelet.so -DDOUBLES=dir -DSPANS=wb-token-spans
#        [-DSANITIZED=ON] -DWORK=dir -P this.
cmake_minimum_required(VERSION 3.25)
foreach(v BENCH PRELOAD DOUBLES SPANS WORK)
  if(NOT ${v})
    message(FATAL_ERROR "pass -D${v}=...")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/ticktock ${WORK}/colocate)
set(ENV{LD_LIBRARY_PATH} "${DOUBLES}")
set(ENV{WLTEST_DEVICE_MEM} "8G")
if(SANITIZED)
  # The sanitizer runtime is linked into the bench, so it comes after the preload in load order;
  # the CUDA kernels' library (nvcc-built) is not sanitized, and LeakSanitizer's thread tracer
  # faults at the exit of such processes (as tests/interpose found), so leaks are not checked.
  set(ENV{ASAN_OPTIONS} "$ENV{ASAN_OPTIONS}:verify_asan_link_order=0:detect_leaks=0")
endif()
# 150 MiB: one replica's wave fits with the other's trough (liballoc maps 20 MiB chunks on the
# doubles: 100 MiB at the peak, 20 at the trough), two peaks (2 x 87 MiB live) do not.
set(limit 157286400)
set(steps 6)
set(common --backend cuda --model resnet --batch 128 --data synthetic --train-samples 1024
           --test-samples 32 --quiet --json --replicas 2 --steps ${steps} --mem-limit ${limit}
           --preload ${PRELOAD})

execute_process(COMMAND ${BENCH} ${common} --mode ticktock --trace-dir ${WORK}/ticktock
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ticktock under the preload: exit ${rc}, expected 0\n${err}\n${out}")
endif()
string(JSON gate GET "${out}" gate)
string(JSON rpeak GET "${out}" replica_peak_bytes)
if(NOT gate STREQUAL "preload")
  message(FATAL_ERROR "ticktock: gate '${gate}', expected preload\n${out}")
endif()
# The combined wave comes from the interposer's traces: a number, at least one replica's peak
# (live bytes, as the ledger admitted them, so within the limit), and the rising time measured.
string(JSON cpeak GET "${out}" peak_bytes)
string(JSON rise GET "${out}" rising_ms)
string(JSON ovl GET "${out}" rising_overlap_ms)
if(cpeak STREQUAL "" OR cpeak LESS rpeak OR cpeak GREATER limit OR NOT rise GREATER 0
   OR ovl GREATER rise)
  message(FATAL_ERROR "ticktock: combined peak ${cpeak} (replica ${rpeak}, limit ${limit}), "
                      "rising ${rise} ms, overlap ${ovl} ms\n${out}")
endif()
# Physical memory together (mapped plus cached, from the traces' MAP/UNMAP events): what the
# budget holds, so within the limit, and at least the live bytes it backs.
string(JSON ppeak GET "${out}" physical_peak_bytes)
if(ppeak STREQUAL "" OR ppeak LESS cpeak OR ppeak GREATER limit)
  message(FATAL_ERROR "ticktock: combined physical peak ${ppeak} (live ${cpeak}, limit ${limit})\n${out}")
endif()
math(EXPR two "2 * ${rpeak}")
if(NOT two GREATER limit)
  message(FATAL_ERROR "ticktock: two peaks (${two}) fit the limit ${limit}: the test proves nothing")
endif()
foreach(i 0 1)
  string(JSON st GET "${out}" per_replica ${i} status)
  string(JSON n GET "${out}" per_replica ${i} steps)
  string(JSON grants GET "${out}" per_replica ${i} gate_grants)
  string(JSON gw TYPE "${out}" per_replica ${i} gate_wait_s)
  string(JSON mw TYPE "${out}" per_replica ${i} mem_wait_s)
  if(NOT mw STREQUAL "NUMBER")
    message(FATAL_ERROR "ticktock replica ${i}: memory wait ${mw}, expected the trace's number\n${out}")
  endif()
  if(NOT st STREQUAL "ok" OR NOT n EQUAL steps)
    message(FATAL_ERROR "ticktock replica ${i}: ${st} after ${n} steps\n${err}\n${out}")
  endif()
  if(NOT gw STREQUAL "NUMBER" OR grants LESS steps)
    message(FATAL_ERROR "ticktock replica ${i}: gate wait ${gw}, ${grants} grants: expected the "
                        "trace's numbers\n${out}")
  endif()
endforeach()
execute_process(COMMAND ${SPANS} ${WORK}/ticktock/replica-0.wlt ${WORK}/ticktock/replica-1.wlt
                RESULT_VARIABLE rc OUTPUT_VARIABLE spans ERROR_VARIABLE err)
message(STATUS "token spans:\n${spans}")
if(NOT rc EQUAL 0 OR NOT spans MATCHES "overlaps 0\n")
  message(FATAL_ERROR "ticktock: token spans overlap or unreadable traces (exit ${rc})\n${spans}${err}")
endif()
foreach(i 0 1)
  if(NOT spans MATCHES "replica-${i}.wlt: grants [0-9]+ spans ([0-9]+)")
    message(FATAL_ERROR "no line for replica ${i}\n${spans}")
  endif()
  if(CMAKE_MATCH_1 LESS steps)
    message(FATAL_ERROR "replica ${i}: ${CMAKE_MATCH_1} token spans for ${steps} steps\n${spans}")
  endif()
endforeach()

# Without a trace the gate's wait is the interposer's alone: not measured, not 0.
execute_process(COMMAND ${BENCH} ${common} --mode ticktock
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON gw TYPE "${out}" per_replica 0 gate_wait_s)
string(JSON mw TYPE "${out}" per_replica 0 mem_wait_s)
if(NOT rc EQUAL 0 OR NOT gw STREQUAL "NULL" OR NOT mw STREQUAL "NULL"
   OR NOT err MATCHES "memory and gate waits not measured")
  message(FATAL_ERROR "ticktock without traces: exit ${rc}, gate wait ${gw}\n${err}\n${out}")
endif()

# Single with --preload: its one replica served by liballoc in alloc mode (never gated), and its
# trace gives the physical peak a budget would count: at least the live peak it backs.
file(MAKE_DIRECTORY ${WORK}/single)
execute_process(COMMAND ${BENCH} --backend cuda --model resnet --batch 128 --data synthetic
                        --train-samples 1024 --test-samples 32 --quiet --json --steps ${steps}
                        --mode single --preload ${PRELOAD} --trace-dir ${WORK}/single
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "single under the preload: exit ${rc}, expected 0\n${err}\n${out}")
endif()
string(JSON gate GET "${out}" gate)
string(JSON pre TYPE "${out}" preload)
string(JSON ppeak GET "${out}" physical_peak_bytes)
string(JSON speak GET "${out}" replica_peak_bytes)
string(JSON grants GET "${out}" per_replica 0 gate_grants)
if(NOT gate STREQUAL "none" OR NOT pre STREQUAL "STRING" OR ppeak STREQUAL "" OR ppeak LESS speak
   OR NOT grants EQUAL 0 OR NOT err MATCHES "under [^\n]*libwavelet[^\n]* \\(alloc mode\\)"
   OR NOT EXISTS ${WORK}/single/replica-0.wlt)
  message(FATAL_ERROR "single under the preload: gate ${gate}, preload ${pre}, physical peak "
                      "${ppeak} (live ${speak}), ${grants} grants\n${err}\n${out}")
endif()
# What a tick-tock pair of it needs, from its trace (iterations from its markers): two copies of
# its wave at their best offsets in physical memory, at least one physical peak and at most 95 %
# of two (the cap).
string(JSON pbud GET "${out}" ticktock_pair_budget_bytes)
math(EXPR cap "2 * ${ppeak} * 95 / 100 + 1")
if(pbud STREQUAL "" OR pbud STREQUAL "null" OR pbud LESS ppeak OR pbud GREATER cap
   OR NOT err MATCHES "a tick-tock pair of this replica needs about")
  message(FATAL_ERROR "single under the preload: pair budget ${pbud} (physical peak ${ppeak})"
                      "\n${err}\n${out}")
endif()

# Colocate without waiting for the budget (--alloc-timeout-ms 0: refused at once, as a GPU nobody
# shares refuses): the replicas start together and collide. (Waiting, one replica could take its
# turn while the other falls, which happened in 2 of ~50 runs: colliding was likely, not certain.)
# Even so, on a loaded machine one replica can be descheduled through the other's peaks (seen
# once in a full parallel ctest): up to three runs, of which one must collide.
foreach(attempt 1 2 3)
  file(REMOVE_RECURSE ${WORK}/colocate)
  file(MAKE_DIRECTORY ${WORK}/colocate)
  execute_process(COMMAND ${BENCH} ${common} --mode colocate --alloc-timeout-ms 0
                          --trace-dir ${WORK}/colocate
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    break()
  endif()
  message(STATUS "colocate run ${attempt}: the replicas did not collide; again")
endforeach()
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "colocate under ${limit}: exit ${rc}, expected 1 (out of memory)\n${err}")
endif()
string(JSON failed GET "${out}" failed)
string(JSON s0 GET "${out}" per_replica 0 status)
string(JSON s1 GET "${out}" per_replica 1 status)
if(failed LESS 1 OR NOT "${s0}${s1}" MATCHES "^(okOOM|OOMok|OOMOOM)$")
  message(FATAL_ERROR "colocate: expected a replica out of memory, got ${s0} and ${s1}\n${out}")
endif()
if(NOT err MATCHES "wavelet-bench: replica [01] \\(pid [0-9]+\\): out of memory at step [0-9]+, in the [^\n]*: cannot allocate [^\n]*cudaMallocAsync: out of memory")
  message(FATAL_ERROR "colocate: no clear out-of-memory line in:\n${err}")
endif()

# A --preload that is not there, and one that is not libwavelet.so: one line, exit 2.
file(WRITE ${WORK}/not-a-library.so "text\n")
foreach(bad ${WORK}/missing/libwavelet.so ${WORK}/not-a-library.so)
  execute_process(COMMAND ${BENCH} ${common} --mode ticktock --preload ${bad}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX MATCHALL "\n" lines "${err}")
  list(LENGTH lines nl)
  if(NOT rc EQUAL 2 OR NOT nl EQUAL 1 OR NOT err MATCHES "^wavelet-bench: --preload [^\n]*${bad}")
    message(FATAL_ERROR "--preload ${bad}: exit ${rc} (expected 2), ${nl} lines:\n${err}")
  endif()
endforeach()
