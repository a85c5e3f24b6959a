"""Fork and compare: set a sandbox up once, snapshot it, fork it, try a different idea in each
fork, and compare what each one got.

    python fork_and_compare.py   # next to `sandcell serve`: found as the CLI finds it
    SANDCELL_API_URL=http://host:7070 SANDCELL_API_KEY=sk-... python fork_and_compare.py
"""

from __future__ import annotations

from sandcell import Sandbox, Sandcell

SETUP = """
import random
random.seed(7)
data = [random.gauss(50, 15) for _ in range(10_000)]

def score(values):
    values = sorted(values)
    return round(values[len(values) // 2], 2)
"""

# Each fork changes the shared state its own way.
STRATEGIES = {
    "clip": "data = [min(max(v, 20), 80) for v in data]",
    "drop-low": "data = [v for v in data if v > 30]",
    "scale": "data = [v * 1.1 for v in data]",
}


def main() -> None:
    with Sandcell() as client, Sandbox.create("python", ephemeral=True, client=client) as base:
        base.run_code(SETUP)
        baseline = base.run_code("score(data)").text
        snap = base.create_snapshot("prepared data", description="10k samples", tags={"example": "fork"})
        print(f"snapshot {snap.id} ({snap.fidelity} fidelity, {snap.size} bytes); baseline score {baseline}")
        forks = Sandbox.fork(snap.id, len(STRATEGIES), labels={"example": "fork"}, client=client)
        try:
            results = {}
            for (name, change), fork in zip(STRATEGIES.items(), forks, strict=True):
                fork.run_code(change)
                results[name] = fork.run_code("(score(data), len(data))").text
            for name, result in results.items():
                print(f"{name:>9}: (score, size) = {result}")
            # The original is untouched by what the forks did.
            assert base.run_code("score(data)").text == baseline
            print(f"   base: score = {baseline} (unchanged)")
        finally:
            for fork in forks:
                fork.kill()
            client.delete_snapshot(snap.id)


if __name__ == "__main__":
    main()
