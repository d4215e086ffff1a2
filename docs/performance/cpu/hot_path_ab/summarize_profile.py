"""Summarise a py-spy raw profile (`py-spy record --format raw --threads --gil`): each thread's share of the
samples, then the functions by self and by inclusive share.

    python summarize_profile.py <(zcat after/profile-server.txt.gz) 30
"""
import collections
import sys


def main(path: str, top: int) -> None:
    threads, self_counts, inclusive = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for line in open(path):
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack:
            continue
        n, frames = int(count), stack.split(";")
        total += n
        threads[frames[0]] += n
        self_counts[frames[-1]] += n
        for frame in set(frames[1:]):
            inclusive[frame] += n
    print("total samples", total)
    for name, n in threads.most_common(10):
        print(f"  thread {n / total:6.1%} {name}")
    for title, counts in (("self:", self_counts), ("inclusive:", inclusive)):
        print(title)
        for name, n in counts.most_common(top):
            print(f"  {n / total:6.1%} {name}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
