cd /work/main && . .venv/bin/activate && export OMP_NUM_THREADS=1
for n in 166 167 168 169 170; do /tmp/swap.sh /tmp/cf$n /tmp/swap/new-at-1.494/cf$n 1.494; done
for n in 158 159 160 161 162 163 164; do /tmp/swap.sh docs/cpu/epyc-2026-12-07/cf$n /tmp/swap/old-at-1.117/cf$n 1.117; done
echo done > /tmp/swap/DONE
