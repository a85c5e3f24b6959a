// Data analysis with a plot: send a CSV into a Python sandbox, analyse it with pandas, draw
// it with matplotlib, and save the figure here as a PNG.
//
//   SANDCELL_API_URL=http://127.0.0.1:7070 SANDCELL_API_KEY=... node examples/data-analysis.mjs [out.png]

import { Sandbox } from "sandcell";

const out = process.argv[2] ?? "monthly-sales.png";

// A small made-up dataset: two products over twelve months.
const rows = ["month,product,units"];
for (let m = 1; m <= 12; m++) {
  rows.push(`${m},widgets,${100 + 12 * m + ((m * 37) % 23)}`);
  rows.push(`${m},gadgets,${180 - 5 * m + ((m * 53) % 31)}`);
}

const ANALYSE = `
import pandas as pd
df = pd.read_csv("data/sales.csv")
pivot = df.pivot(index="month", columns="product", values="units")
print(pivot.describe().loc[["mean", "min", "max"]].round(1).to_string())
growth = (pivot.iloc[-1] / pivot.iloc[0] - 1) * 100
growth.round(1).to_dict()
`;

// The kernel keeps its variables: the plot uses the DataFrame the analysis made.
const PLOT = `
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(7, 4))
pivot.plot(ax=ax, marker="o")
ax.set_title("Units sold per month")
ax.set_xlabel("month")
ax.set_ylabel("units")
fig.tight_layout()
`;

// Plain JavaScript on Node 20 has no `await using`: try/finally ends the sandbox.
const sandbox = await Sandbox.create({ template: "python", labels: { example: "data-analysis" } });
try {
  await sandbox.writeFile("data/sales.csv", rows.join("\n") + "\n");

  const analysis = await sandbox.runCode(ANALYSE, { onStdout: (text) => process.stdout.write(text) });
  if (!analysis.ok) throw new Error(`analysis failed: ${analysis.error?.name}: ${analysis.error?.value}`);
  console.log(`growth over the year (%): ${analysis.text}`);

  const plot = await sandbox.runCode(PLOT);
  const figure = plot.results.find((r) => r.png !== undefined);
  if (figure === undefined) throw new Error(`no figure came back: ${JSON.stringify(plot.results.map((r) => r.formats))}`);
  await figure.saveImage(out);
  console.log(`saved ${out} (${figure.png.length} bytes)`);
} finally {
  await sandbox.kill();
}
