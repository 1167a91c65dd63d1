# Bad arguments (36) make wavelet-bench exit 2 with one line naming the argument, then the usage;
# --help exits 0; a bad data directory or --backend cuda without a GPU is one clear line.
# Usage: cmake -DBENCH=path -DWORK=dir -P this.
cmake_minimum_required(VERSION 3.25)
if(NOT BENCH OR NOT WORK)
  message(FATAL_ERROR "pass -DBENCH=<path to wavelet-bench> -DWORK=<scratch dir>")
endif()

set(PROG wavelet-bench)
set(BAD_USAGE ON)
include(${CMAKE_CURRENT_LIST_DIR}/bad_args.cmake)

bad("--model: expected mlp, cnn or resnet, got 'vgg'" --model vgg)
bad("--backend: expected auto, cpu or cuda, got 'tpu'" --backend tpu)
bad("--mode: expected single, colocate or ticktock, got 'both'" --mode both)
bad("--replicas: expected a whole number from 1 to 16, got '0'" --replicas 0)
bad("--replicas: expected a whole number from 1 to 16, got '17'" --replicas=17)
bad("--steps: expected a whole number from 1 to [0-9]+, got 'x'" --steps x)
bad("--epochs: expected a whole number from 1 to 1000, got '-1'" --epochs -1)
bad("--batch: expected a whole number from 1 to 4096, got '5000'" --batch 5000)
bad("--mem-limit: expected a size in bytes with an optional K/M/G/T suffix, got '12Q'"
    --mem-limit 12Q)
bad("--alloc-timeout-ms: expected a whole number of milliseconds, 0 to 3600000, got '-1'"
    --alloc-timeout-ms -1)
bad("--lr: expected a learning rate above 0, at most 10, got '0'" --lr 0)
bad("--lr: expected a learning rate float32 holds, from 1.2e-38 to 10, got '1e-50'" --lr 1e-50)
bad("--lr: expected a learning rate float32 holds, from 1.2e-38 to 10, got '1e-40'" --lr 1e-40)
bad("--optimizer: expected adam or sgd, got 'lion'" --optimizer lion)
bad("--schedule: expected cosine or constant, got 'step'" --schedule step)
bad("--threads: expected a whole number from 1 to 256" --threads 0)
bad("--seed: expected a whole number, got '1.5'" --seed 1.5)
bad("--steps and --epochs: expected one of them, got both" --steps 3 --epochs 1)
bad("--replicas 2 with --mode single: expected 1 replica" --mode single --replicas 2)
bad("--replicas 1 with --mode ticktock: expected 2 or more" --mode ticktock --replicas 1)
bad("--batch: expected a value" --batch)
bad("--json takes no value, got 'yes'" --json=yes)
bad("--gpus: expected a whole number from 1 to 64, got '0'" --gpus 0)
bad("--gpus: expected a whole number from 1 to 64, got 'abc'" --gpus abc)
bad("--ranks: expected a whole number from 1 to 64, got '65'" --ranks 65)
bad("--gpus 8 with 16 replicas: expected at most 64 processes" --gpus 8 --replicas 16)
bad("--nodes, --node and --nccl-id: expected with --gpus" --nodes 2)
bad("--nodes 2: expected --nccl-id PATH" --gpus 1 --nodes 2)
bad("--node 2: expected 0 to 1 \\(--nodes 2\\)" --gpus 1 --nodes 2 --node 2 --nccl-id x)
bad("--gate: expected preload or embedded, got 'auto'" --gate auto)
bad("--preload: expected the path of libwavelet.so, got ''" --preload=)
bad("unknown argument '--gpu'" --gpu 2)
bad("unknown argument 'extra'" extra)
bad("--trace-dir ${WORK}/none: expected an existing directory" --backend cpu --trace-dir
    ${WORK}/none)
bad("--eval-each-epoch with --epochs 65: expected at most 64 epochs" --eval-each-epoch
    --epochs 65)
bad("--eval-each-epoch with --steps 65: expected at most 64 epochs .*, got 65 of 1 steps"
    --backend cpu --data synthetic --train-samples 64 --eval-each-epoch --steps 65)
bad("--save-weights ${WORK}/none/w: expected a file in an existing, writable directory \\(${WORK}/none: No such file"
    --backend cpu --save-weights ${WORK}/none/w)

execute_process(COMMAND ${BENCH} --help RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^usage: wavelet-bench")
  message(FATAL_ERROR "wavelet-bench --help: exit ${rc}, stdout:\n${out}")
endif()

# A directory without the data: one line naming it and what was expected; exit 1.
file(MAKE_DIRECTORY ${WORK}/empty)
execute_process(COMMAND ${BENCH} --backend cpu --data ${WORK}/empty RESULT_VARIABLE rc
                ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES
   "^wavelet-bench: [^\n]*/empty: no train-images-idx3-ubyte.gz or train-images-idx3-ubyte: expected")
  message(FATAL_ERROR "wavelet-bench --data empty dir: exit ${rc}, stderr:\n${err}")
endif()

# --backend cuda runs where a GPU is; elsewhere it is one clear line and exit 1.
execute_process(COMMAND ${BENCH} --backend cuda --model mlp --steps 1 --data synthetic
                        --train-samples 64 --test-samples 64 --quiet
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0 AND NOT (rc EQUAL 1 AND err MATCHES
   "^wavelet-bench: --backend cuda: (no usable CUDA device|this build has no CUDA backend)"))
  message(FATAL_ERROR "wavelet-bench --backend cuda: exit ${rc}, stderr:\n${err}")
endif()
