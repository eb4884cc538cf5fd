#!/usr/bin/env node
// Drives a Norsk Manager with the vendor's own generated client
// (@norskvideo/norsk-api 1.0.384 over @grpc/grpc-js): CreateJob, JobSearch,
// EventStream up to InitialDataComplete, and StartJob on a node (a started
// one from the snapshot, or one created with CreateAwsNode) until the job
// runs. Every message received is checked for fields and oneof variants the
// published API does not have: the client keeps those as unknown fields, and
// a Manager that speaks only the published API sends none.
//
// Usage: node check.js HOST:PORT
// Exits 0 when everything worked; otherwise prints what failed and exits 1.

'use strict';

const grpc = require('@grpc/grpc-js');
const { proto3 } = require('@bufbuild/protobuf');
const { ManagerClient } = require('@norskvideo/norsk-api/lib/manager_grpc_pb.js');
const pb = require('@norskvideo/norsk-api/lib/manager_pb.js');
const common = require('@norskvideo/norsk-api/lib/shared/common_pb.js');

/** How long any one step may take, in milliseconds. */
const STEP_TIMEOUT_MS = 20000;
const JOB_ID = 'vendor-client-j1';
const NODE_ID = 'vendor-client-n1';

function fail(message) {
  console.error(`vendor client check failed: ${message}`);
  process.exit(1);
}

/**
 * The fields of `message` (and of every message inside it) the published
 * client does not know, as `Type.number` strings; `path` says where.
 */
function unknownFields(message, path = message.getType().typeName) {
  const found = proto3.bin
    .listUnknownFields(message)
    .map((field) => `${path}.${field.no}`);
  for (const field of message.getType().fields.list()) {
    let value;
    if (field.oneof) {
      const chosen = message[field.oneof.localName];
      value = chosen.case === field.localName ? chosen.value : undefined;
    } else {
      value = message[field.localName];
    }
    if (value === undefined) continue;
    const inner = `${path}.${field.name}`;
    if (field.kind === 'message') {
      const values = field.repeated ? value : [value];
      for (const v of values) found.push(...unknownFields(v, inner));
    } else if (field.kind === 'map' && field.V.kind === 'message') {
      for (const v of Object.values(value)) found.push(...unknownFields(v, inner));
    }
  }
  return found;
}

/** Fails when `message` carries anything the published API does not have. */
function checkPublished(message, what) {
  const unknown = unknownFields(message);
  if (unknown.length > 0) {
    fail(`${what} carries fields the published API does not have: ${unknown.join(', ')}`);
  }
  if (message instanceof pb.EventStreamEvent && message.event.case === undefined) {
    fail(`${what} is an event the published API does not have`);
  }
}

function withTimeout(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${STEP_TIMEOUT_MS} ms waiting for ${what}`)), STEP_TIMEOUT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function unary(client, method, request) {
  return withTimeout(
    new Promise((resolve, reject) => {
      client[method](request, (err, reply) => (err ? reject(new Error(`${method}: ${err.message}`)) : resolve(reply)));
    }),
    method,
  );
}

function collect(call, what) {
  return withTimeout(
    new Promise((resolve, reject) => {
      const items = [];
      call.on('data', (item) => items.push(item));
      call.on('error', (err) => reject(new Error(`${what}: ${err.message}`)));
      call.on('end', () => resolve(items));
    }),
    what,
  );
}

/**
 * Reads an event stream: `next(predicate, what)` resolves with the first
 * event (from now on) the predicate accepts, checking every event read.
 */
function follow(call) {
  const queue = [];
  let waiting = null;
  let ended = null;
  const wake = () => {
    if (waiting) waiting();
  };
  call.on('data', (event) => {
    checkPublished(event, `event ${event.event.case ?? '(unknown)'}`);
    queue.push(event);
    wake();
  });
  call.on('error', (err) => {
    ended = err;
    wake();
  });
  call.on('end', () => {
    ended = ended || new Error('the event stream ended');
    wake();
  });
  const next = (accept, what) =>
    withTimeout(
      new Promise((resolve, reject) => {
        const look = () => {
          while (queue.length > 0) {
            const event = queue.shift();
            if (accept(event)) {
              waiting = null;
              resolve(event);
              return;
            }
          }
          if (ended) {
            reject(new Error(`event stream ended before ${what}: ${ended.message}`));
            return;
          }
          waiting = look;
        };
        look();
      }),
      what,
    );
  return { next };
}

function nodeIdOf(event) {
  const metadata = event.event.value.nodeMetadata;
  return metadata && metadata.nodeId ? metadata.nodeId.nodeId : undefined;
}

async function main() {
  const address = process.argv[2];
  if (!address) fail('usage: node check.js HOST:PORT');
  const client = new ManagerClient(address, grpc.credentials.createInsecure());

  const stream = client.eventStream(new pb.EventStreamRequest({}));
  const events = follow(stream);
  const snapshot = [];
  await events.next((event) => {
    snapshot.push(event);
    return event.event.case === 'initialDataComplete';
  }, 'InitialDataComplete');

  const job = new pb.Job({
    jobId: new common.JobId({ jobId: JOB_ID }),
    description: 'created by the vendor client',
    tags: { origin: 'vendor-client' },
    state: pb.Job_JobState.ACTIVE,
  });
  const hash = await unary(client, 'createJob', job);
  checkPublished(hash, 'JobHash');
  if (hash.hash <= 0n) fail(`CreateJob answered hash ${hash.hash}`);

  const search = new pb.JobSearchRequest({
    jobFilter: [
      new pb.JobFilter({
        jobFilter: { case: 'idFilter', value: new pb.IdFilter({ comparison: { case: 'eq', value: JOB_ID } }) },
      }),
    ],
  });
  const found = await collect(client.jobSearch(search), 'JobSearch');
  found.forEach((current) => checkPublished(current, 'JobSearch result'));
  if (found.length !== 1 || !found[0].job || found[0].job.description !== job.description) {
    fail(`JobSearch for ${JOB_ID} found ${JSON.stringify(found.map((c) => c.toJson()))}`);
  }

  const started = snapshot.find((event) => event.event.case === 'nodeStarted');
  let nodeId = started ? nodeIdOf(started) : undefined;
  if (!nodeId) {
    nodeId = NODE_ID;
    await unary(
      client,
      'createAwsNode',
      new pb.CreateAwsNodeRequest({
        nodeId: new common.NodeId({ nodeId }),
        region: 'eu-west-1',
        instanceType: 'm5.xlarge',
      }),
    );
    await events.next((event) => event.event.case === 'nodeStarted' && nodeIdOf(event) === nodeId, `NodeStarted ${nodeId}`);
  }

  await unary(
    client,
    'startJob',
    new pb.StartJobRequest({
      jobId: new common.JobId({ jobId: JOB_ID }),
      role: 'primary',
      nodeId: new common.NodeId({ nodeId }),
    }),
  );
  await events.next((event) => {
    if (event.event.case !== 'jobUpdated') return false;
    const withHistory = event.event.value.jobWithHistory;
    if (!withHistory || !withHistory.job || withHistory.job.jobId.jobId !== JOB_ID) return false;
    const last = withHistory.historyEntry[withHistory.historyEntry.length - 1];
    return last !== undefined && last.historyEntry.case === 'jobRunning';
  }, `${JOB_ID} running on ${nodeId}`);

  stream.cancel();
  client.close();
  console.log(`vendor client check passed: ${JOB_ID} created, found and running on ${nodeId}`);
}

main().catch((err) => fail(err.message));
