// Fork and compare: prepare a sandbox with state (a dataset and a scoring function in the
// Python kernel, a config file on disk), snapshot it, fork the snapshot into three sandboxes,
// try a different strategy in each, and compare — the source never changes.
//
//   SANDCELL_API_URL=http://127.0.0.1:7070 SANDCELL_API_KEY=... node examples/fork-and-compare.mjs

import { Sandbox } from "sandcell";

const SETUP = `
import json, random
random.seed(7)
data = [random.gauss(50, 15) for _ in range(2000)] + [400, 420, -300]   # a few outliers
def score(values):
    mean = sum(values) / len(values)
    return round(abs(mean - 50), 3)                                     # distance from the truth
with open("config.json", "w") as f:
    json.dump({"experiment": "outliers"}, f)
f"{len(data)} points, raw score {score(data)}"
`;

// One strategy per fork: each changes the kernel's state in its own way.
const STRATEGIES = {
  "keep everything": "kept = data",
  "trim 1% each side": "s = sorted(data); k = len(s) // 100; kept = s[k:-k]",
  "drop beyond 3 sigma": `
m = sum(data) / len(data)
sd = (sum((x - m) ** 2 for x in data) / len(data)) ** 0.5
kept = [x for x in data if abs(x - m) <= 3 * sd]`,
};

const source = await Sandbox.create({ template: "python", labels: { example: "fork-and-compare" } });
const forks = [];
try {
  const setup = await source.runCode(SETUP);
  if (!setup.ok) throw new Error(`setup failed: ${setup.error?.value}`);
  console.log(`source ${source.id}: ${setup.text}`);

  const snapshot = await source.createSnapshot({ name: "outliers-base", tags: { example: "fork-and-compare" } });
  const saved = snapshot.manifest.kernels.flatMap((k) => k.saved);
  console.log(`snapshot ${snapshot.id} (${snapshot.fidelity} fidelity) carries: ${saved.join(", ")}`);

  const names = Object.keys(STRATEGIES);
  forks.push(...(await snapshot.fork({ count: names.length, labels: { example: "fork-and-compare" } })));

  // Every fork works at the same time, on its own copy of the state.
  const results = await Promise.all(
    forks.map(async (fork, i) => {
      const name = names[i];
      const run = await fork.runCode(`${STRATEGIES[name]}\nresult = {"points": len(kept), "score": score(kept)}`);
      if (!run.ok) throw new Error(`${name}: ${run.error?.value}`);
      // Variables come back as JSON values.
      const { values } = await fork.getVariables({ names: ["result"] });
      const config = JSON.parse(await fork.readFile("config.json"));
      return { strategy: name, sandbox: fork.id, ...values.result, config: config.experiment };
    }),
  );
  console.table(results);

  const untouched = await source.runCode("'kept' in globals(), len(data)");
  console.log(`source after the forks: ${untouched.text} (no 'kept', all points)`);
  const best = results.reduce((a, b) => (a.score <= b.score ? a : b));
  console.log(`best strategy: ${best.strategy} (score ${best.score})`);
  await snapshot.delete();
} finally {
  await Promise.all([source, ...forks].map((s) => s.kill()));
}
