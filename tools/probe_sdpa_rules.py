"""Probe: random SDPA declarations through NVIDIA's cudnn.pygraph and ours; prints the
declarations whose validate() verdicts differ, grouped by the pair of verdicts.

    PYTHONPATH=$PWD/src:$PWD/tests/sdpa python tools/probe_sdpa_rules.py [N] [seed] [op]
"""

import collections
import random
import sys

import cudnn
from sdpa_declarations import case_id, random_case, same_verdict, verdict

import cudnn_pygraph as ours


def main(n=300, seed=0, op=None):
    rng = random.Random(seed)
    groups = collections.defaultdict(list)
    agree = 0
    refused = collections.Counter()
    for _ in range(n):
        case = random_case(rng, op)
        theirs, mine = verdict(cudnn, case), verdict(ours, case)
        if same_verdict(theirs, mine):
            agree += 1
            refused[theirs[0]] += 1
            continue
        groups[(theirs[0] + ": " + theirs[1][:110], mine[0] + ": " + mine[1][:160])].append(case)
    print(f"{agree}/{n} agree; verdicts among them: {dict(refused)}")
    for (t, m), cases in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"\n[{len(cases)}] NVIDIA {t}\n      ours   {m}\n      e.g. {case_id(cases[0])}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        int(args[0]) if args else 300,
        int(args[1]) if len(args) > 1 else 0,
        args[2] if len(args) > 2 else None,
    )
