// Two audio worklets: "capture" hands 128-sample blocks of its input to the page, and
// "player" plays the decoded frames it is given, in order, counting the samples it played.
class Capture extends AudioWorkletProcessor {
  process(inputs) {
    const ch = inputs[0] && inputs[0][0];
    if (ch && ch.length) this.port.postMessage(ch.slice());
    return true;
  }
}

class Player extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = [];
    this.offset = 0;
    this.played = 0;
    this.port.onmessage = (e) => this.queue.push(e.data);
  }
  process(_inputs, outputs) {
    const out = outputs[0][0];
    let i = 0;
    while (i < out.length && this.queue.length) {
      const head = this.queue[0];
      const n = Math.min(out.length - i, head.length - this.offset);
      out.set(head.subarray(this.offset, this.offset + n), i);
      i += n;
      this.offset += n;
      if (this.offset === head.length) { this.queue.shift(); this.offset = 0; }
    }
    if (i > 0) { this.played += i; this.port.postMessage(this.played); }
    return true;
  }
}

registerProcessor("capture", Capture);
registerProcessor("player", Player);
