#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (under 5 minutes): builds the node agent,
# runs `discover --gpu-source nvml`, and compares what it found with
# `nvidia-smi`: the same cards (index, UUID, name, memory, PCI bus id,
# compute capability) and driver version. Prints both and exits non-zero on a
# difference. (The kubelet-plugin prepare path joins this script when the
# agent serves DRA.)
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v nvidia-smi >/dev/null || { echo "run.sh: no nvidia-smi: this script needs a GPU machine" >&2; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/switchyard/target}"
cargo build --release -p switchyard-node-agent
agent="$CARGO_TARGET_DIR/release/switchyard-node-agent"
out="$(mktemp -d)"
"$agent" discover --gpu-source nvml --node "$(hostname)" -o json > "$out/discover.json"
nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,compute_cap,driver_version,mig.mode.current \
  --format=csv,noheader,nounits > "$out/smi.csv"
echo "== nvidia-smi"; cat "$out/smi.csv"
echo "== switchyard-node-agent discover (ResourceSlices' devices)"
python3 - "$out/discover.json" "$out/smi.csv" <<'PY'
import csv, json, sys
listing = json.load(open(sys.argv[1]))
reports = [i for i in listing["items"] if i["kind"] == "PhysicalGPU"]
slices = [i for i in listing["items"] if i["kind"] == "ResourceSlice"]
devices = [d for s in slices for d in s["spec"].get("devices") or []]
for d in devices:
    a = d["attributes"]
    print(d["name"], a["type"]["string"], a["uuid"]["string"], a["productName"]["string"],
          d["capacity"]["memory"]["value"], a.get("profile", {}).get("string", ""))
smi = [[c.strip() for c in row] for row in csv.reader(open(sys.argv[2]))]
problems = []
if len(reports) != len(smi):
    problems.append(f"{len(reports)} PhysicalGPUs, nvidia-smi lists {len(smi)} cards")
by_index = {r["spec"]["index"]: r for r in reports}
for index, uuid, name, memory, bus, cc, driver, mig in smi:
    r = by_index.get(int(index))
    if r is None:
        problems.append(f"card {index} not reported"); continue
    if r["spec"]["uuid"] != uuid: problems.append(f"card {index}: uuid {r['spec']['uuid']} != {uuid}")
    if r["spec"]["product"] != name: problems.append(f"card {index}: product {r['spec']['product']} != {name}")
    caps = r["status"]["capabilities"]
    if caps["memoryMiB"] != int(memory): problems.append(f"card {index}: memory {caps['memoryMiB']} != {memory}")
    if caps["computeCapability"] != cc: problems.append(f"card {index}: compute capability {caps['computeCapability']} != {cc}")
    card = [d for d in devices if d["attributes"]["uuid"]["string"] == uuid or
            d["attributes"].get("parentUUID", {}).get("string") == uuid]
    if not card: problems.append(f"card {index}: no device published")
    for d in card:
        if d["attributes"]["pcieBusID"]["string"] != bus.lower(): problems.append(f"card {index}: bus {d['attributes']['pcieBusID']} != {bus}")
        if d["attributes"]["driverVersion"]["version"] != ".".join(str(int(p)) for p in driver.split(".")):
            problems.append(f"card {index}: driver {d['attributes']['driverVersion']} != {driver}")
print("\n".join(problems) if problems else "OK: the agent's inventory matches nvidia-smi")
sys.exit(1 if problems else 0)
PY
