#!/bin/bash
# Build one cohort into one output with a Slurm job array: each array task builds its part, no coordination.
# Submit:   sbatch examples/build_slurm.sh /data/slides s3://bucket/shards
# Then, when all tasks have finished:   wsishard merge s3://bucket/shards
#
# wsishard reads SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT (and SLURM_ARRAY_TASK_MIN) as the default --part,
# so the same command runs in every task. A task that dies can simply be re-run: it resumes its part.
#SBATCH --job-name=wsishard-build
#SBATCH --array=0-15
#SBATCH --cpus-per-task=16
#SBATCH --mem=32G
#SBATCH --time=04:00:00
#SBATCH --output=wsishard-build-%A-%a.log
set -euo pipefail
SLIDES=${1:?usage: sbatch build_slurm.sh SLIDES OUT}
OUT=${2:?usage: sbatch build_slurm.sh SLIDES OUT}
srun wsishard build "$SLIDES" -o "$OUT" --mpp 0.5 --patch-size 256 --jobs "${SLURM_CPUS_PER_TASK:-16}" --seed 0 -q
