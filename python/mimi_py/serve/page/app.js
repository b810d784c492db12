// The page: microphone or file -> "capture" worklet -> s16le frames over /encode; each frame's
// codes are drawn (codebook x time) and sent on over /decode; the decoded s16le frames are
// played by the "player" worklet. window.mimi holds the counters (the browser test reads them).
// A server with a token is opened as /#token=TOKEN: the fragment never leaves the browser, and the
// token goes on each stream's URL (?token=), since a browser cannot set a WebSocket's headers.
"use strict";
const stats = (window.mimi = {
  state: "idle", sent: 0, encoded: 0, decoded: 0, played: 0, latencies: [], done: null, error: null,
});
const $ = (id) => document.getElementById(id);
let ctx, enc, dec, source, codec, pending, filled, sentAt;

const token = new URLSearchParams(location.hash.slice(1)).get("token");

function streamUrl(path) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const auth = token ? `${path.includes("?") ? "&" : "?"}token=${encodeURIComponent(token)}` : "";
  return `${scheme}://${location.host}${path}${auth}`;
}

function open(path) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(streamUrl(path));
    ws.binaryType = "arraybuffer";
    ws.onopen = () => resolve(ws);
    const hint = token ? "is the token in the URL right?" : "does the server need a token? open /#token=TOKEN";
    ws.onerror = () => reject(new Error(`cannot open ${path} (${hint})`));
  });
}

function feed(block) {
  // Samples into whole frames of s16le; each frame is sent once it is full.
  for (let i = 0; i < block.length; i++) {
    const s = Math.max(-1, Math.min(1, block[i]));
    pending[filled++] = Math.round(s * 32767);
    if (filled === pending.length) {
      sentAt.push(performance.now());
      enc.send(pending.buffer.slice(0));
      stats.sent++;
      filled = 0;
    }
  }
}

function draw(codes) {
  // One column per frame, one row per codebook, the code's value as a hue.
  const c = $("codes"), g = c.getContext("2d"), x = stats.encoded % c.width;
  codes.forEach((code, q) => {
    g.fillStyle = `hsl(${(360 * code) / codec.cardinality}, 80%, 55%)`;
    g.fillRect(x, q, 1, 1);
  });
  g.fillStyle = "#fff";
  g.fillRect((x + 1) % c.width, 0, 1, c.height);
}

function quantile(xs, q) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
}

function onCodes(e) {
  const msg = JSON.parse(e.data);
  if ("done" in msg) {
    stats.done = msg.done;
    dec.send("end");
    return;
  }
  stats.latencies.push(performance.now() - sentAt[msg.frame]);
  draw(msg.codes);
  stats.encoded++;
  dec.send(Uint32Array.from(msg.codes).buffer);
  const ms = (x) => `${x.toFixed(0)} ms`;
  const l = stats.latencies;
  $("frames").textContent = stats.encoded;
  $("latency").textContent = `${ms(l[l.length - 1])} / ${ms(quantile(l, 0.5))} / ${ms(quantile(l, 0.99))}`;
}

function onAudio(e) {
  if (typeof e.data === "string") return; // {"done": n}
  const pcm = new Int16Array(e.data), x = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) x[i] = pcm[i] / 32768;
  stats.decoded += x.length; // before the transfer empties x
  player.port.postMessage(x, [x.buffer]);
  $("played").textContent =
    `${(stats.decoded / codec.sample_rate).toFixed(1)} s / ${(stats.played / codec.sample_rate).toFixed(1)} s`;
}

let player;
async function source_for(kind, file) {
  if (kind === "mic") {
    const audio = { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false };
    return ctx.createMediaStreamSource(await navigator.mediaDevices.getUserMedia({ audio }));
  }
  const node = ctx.createBufferSource();
  node.buffer = await ctx.decodeAudioData(await file.arrayBuffer());
  node.onended = stop;
  node.start();
  return node;
}

async function start(kind, file) {
  try {
    codec = (await (await fetch("/health")).json()).codec;
    pending = new Int16Array(codec.frame_size);
    filled = 0;
    sentAt = [];
    const bits = Math.log2(codec.cardinality) * codec.num_codebooks * codec.frame_rate;
    $("bitrate").textContent = `${(bits / 1000).toFixed(2)} kbit/s (${codec.num_codebooks} codebooks)`;
    $("codes").height = codec.num_codebooks;
    ctx = new AudioContext({ sampleRate: codec.sample_rate });
    await ctx.audioWorklet.addModule("worklets.js");
    [enc, dec] = await Promise.all([open("/encode?format=s16le"), open("/decode?format=s16le")]);
    enc.onmessage = onCodes;
    dec.onmessage = onAudio;
    enc.onclose = dec.onclose = (e) => {
      if (e.code !== 1000) stats.error = `closed ${e.code} ${e.reason}`;
      $("error").textContent = stats.error || "";
    };
    const capture = new AudioWorkletNode(ctx, "capture");
    player = new AudioWorkletNode(ctx, "player");
    player.port.onmessage = (e) => (stats.played = e.data);
    player.connect(ctx.destination);
    const mute = ctx.createGain();
    mute.gain.value = 0;
    capture.connect(mute).connect(ctx.destination); // a worklet only runs when its output is pulled
    capture.port.onmessage = (e) => feed(e.data);
    source = await source_for(kind, file);
    source.connect(capture);
    await ctx.resume();
    stats.state = "streaming";
  } catch (err) {
    stats.error = String(err);
    $("error").textContent = stats.error;
  }
  $("state").textContent = stats.state;
  $("stop").disabled = stats.state !== "streaming";
}

function stop() {
  if (stats.state !== "streaming") return;
  source.disconnect();
  if (filled) feed(new Float32Array(pending.length - filled)); // pad the last frame with silence
  enc.send("end");
  stats.state = "ended";
  $("state").textContent = stats.state;
  $("stop").disabled = true;
}

window.mimiStart = start;
window.mimiStop = stop;
$("mic").onclick = () => start("mic");
$("file").onchange = (e) => e.target.files.length && start("file", e.target.files[0]);
$("stop").onclick = stop;
