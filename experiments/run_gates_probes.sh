#!/usr/bin/env bash
# The measurements behind docs/gates-investigation.md (issue 20, part 1), one probe at a time,
# 1 thread each.  Runs already done (JSON status done) are skipped, so this can be re-run;
# the long runs checkpoint every epoch and resume (--ckpt-dir, --resume).
#   LSTMABLATE_DATA=../shared/data nohup experiments/run_gates_probes.sh > /tmp/gates_probes.log 2>&1 &
set -u
cd "$(dirname "$0")/.."
P=".venv/bin/python experiments/gates_probe.py --threads 1 --skip-done --valid"
CKPT=${GATES_CKPT:-/tmp/gates-ckpt}

# 1. PTB small, the first 600 minibatches (of 2,323 per epoch) at the tutorial's lr 1.0
$P --size small --steps 600 \
   --candidate lstm --candidate eq1 --candidate project --candidate tanh-tanh \
   --candidate eq1-tf-bias0 --candidate eq1-tf-slices-norm --candidate eq1-tf-exact \
   --candidate eq1-mean-loss --candidate gates-1-1-1 --candidate gates-half --candidate gates-bias \
   --candidate eq1-relu --candidate eq1-hardtanh --candidate eq1-sigmoid
# 2. PTB small, eq 1 at lower learning rates, and other seeds at lr 1.0
$P --size small --steps 600 --candidate eq1 --lr 0.5 --lr 0.3 --lr 0.2 --lr 0.1
$P --size small --steps 600 --candidate eq1 --seed 2
# 3. PTB medium, the first 200 minibatches (of 1,327 per epoch)
$P --size medium --steps 200 \
   --candidate lstm --candidate eq1 --candidate tanh-tanh --candidate eq1-tf-exact \
   --candidate eq1-cudnn-dropout --candidate gates-half --candidate eq1-sigmoid
$P --size medium --steps 200 --candidate eq1 --lr 0.3 --lr 0.1
# 4. PTB medium, eq 1 at Levy et al.'s footnote-2 learning rate 0.1: the first two epochs
#    (1,327 minibatches each, valid perplexity after each)
$P --size medium --candidate eq1 --lr 0.1 --epochs 2 --ckpt-dir "$CKPT" --resume
# 5. Does an exploded run recover?  PTB small, eq 1 at lr 1.0 through the tutorial's whole
#    schedule (13 epochs, x0.5 per epoch after epoch 4), valid perplexity after every epoch.
$P --size small --candidate eq1 --epochs 13 --ckpt-dir "$CKPT" --resume
