"""Data analysis with a plot: pandas and matplotlib run in the sandbox, the chart comes back as
a PNG and is saved here.

    python data_analysis.py [out.png]   # next to `sandcell serve`: found as the CLI finds it
    SANDCELL_API_URL=http://host:7070 SANDCELL_API_KEY=sk-... python data_analysis.py [out.png]
"""

from __future__ import annotations

import sys

from sandcell import Sandbox

SALES_CSV = """month,region,units
2026-01,north,120
2026-01,south,90
2026-02,north,135
2026-02,south,110
2026-03,north,160
2026-03,south,95
2026-04,north,170
2026-04,south,130
"""

ANALYSIS = """
import pandas as pd
import matplotlib.pyplot as plt

df = pd.read_csv("sales.csv")
by_month = df.pivot_table(index="month", columns="region", values="units", aggfunc="sum")
growth = by_month.pct_change().mean() * 100
print("average monthly growth (%):")
print(growth.round(1).to_string())

ax = by_month.plot(marker="o", title="Units sold per region")
ax.set_ylabel("units")
plt.tight_layout()
by_month.sum().to_dict()
"""


def main(out: str) -> None:
    with Sandbox.create("python", ephemeral=True) as sb:
        sb.write_file("sales.csv", SALES_CSV)
        run = sb.run_code(ANALYSIS, on_stdout=lambda text: print(text, end=""))
        if run.error is not None:
            raise SystemExit(f"the analysis failed:\n{run.error}")
        print("totals:", run.text)
        run.save_png(out)
        print(f"chart saved to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sales.png")
