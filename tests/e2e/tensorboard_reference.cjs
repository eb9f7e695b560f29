// Reference reader of TensorBoard event files for the tests, independent of lattice: TFRecord
// framing checked with @aws-crypto/crc32c (length and data CRCs, masked as TensorFlow masks
// them), the records decoded with protobufjs against TensorFlow's Event and Summary messages
// (tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto; the fields a
// scalar uses).
//   node tensorboard_reference.cjs NPM_DIR EVENTS_FILE
// Prints the file_version on the first line, then one JSON object per scalar:
// {"step": ..., "tag": "...", "value": ..., "wall_time": ...}. Exits 1 naming the record on a
// bad CRC, a torn record or a message that does not decode.
"use strict";
const fs = require("fs");
const path = require("path");

const [npmDir, file] = process.argv.slice(2);
const req = (m) => require(path.resolve(npmDir, "node_modules", m));
const protobuf = req("protobufjs");
const { crc32c } = req("@aws-crypto/crc32c");

const root = protobuf.parse(`
syntax = "proto3";
package tensorflow;
message Summary {
  message Value {
    string node_name = 7;
    string tag = 1;
    oneof value {
      float simple_value = 2;
      bytes obsolete_old_style_histogram = 3;
    }
  }
  repeated Value value = 1;
}
message Event {
  double wall_time = 1;
  int64 step = 2;
  oneof what {
    string file_version = 3;
    bytes graph_def = 4;
    Summary summary = 5;
  }
}
`).root;
const Event = root.lookupType("tensorflow.Event");

const masked = (buf) => {
  const c = crc32c(buf) >>> 0;
  return ((((c >>> 15) | (c << 17)) >>> 0) + 0xa282ead8) >>> 0;
};
const die = (msg) => {
  process.stderr.write(`tensorboard_reference: ${file}: ${msg}\n`);
  process.exit(1);
};

const data = fs.readFileSync(file);
let at = 0;
let record = 0;
const out = [];
while (at < data.length) {
  if (at + 12 > data.length) die(`record ${record}: torn header at byte ${at}`);
  const lenBytes = data.subarray(at, at + 8);
  const len = Number(data.readBigUInt64LE(at));
  if (data.readUInt32LE(at + 8) !== masked(lenBytes)) die(`record ${record}: bad length CRC`);
  if (at + 12 + len + 4 > data.length) die(`record ${record}: torn data`);
  const body = data.subarray(at + 12, at + 12 + len);
  if (data.readUInt32LE(at + 12 + len) !== masked(body)) die(`record ${record}: bad data CRC`);
  let ev;
  try {
    ev = Event.toObject(Event.decode(body), { longs: String });
  } catch (e) {
    die(`record ${record}: ${e.message}`);
  }
  if (record === 0) {
    if (!ev.fileVersion) die("the first record is not a file_version event");
    out.push(ev.fileVersion);
  } else {
    for (const v of (ev.summary && ev.summary.value) || [])
      out.push(JSON.stringify({ step: Number(ev.step), tag: v.tag, value: v.simpleValue, wall_time: ev.wallTime }));
  }
  at += 12 + len + 4;
  record += 1;
}
process.stdout.write(out.join("\n") + "\n");
