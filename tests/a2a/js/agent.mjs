// An A2A agent built only with the official JavaScript SDK's server classes: JSON-RPC and
// REST on express, gRPC on @grpc/grpc-js, one DefaultRequestHandler with in-memory task and
// push stores and the SDK's push sender.
//
//   node agent.mjs HTTP_PORT GRPC_PORT FIRST_BINDING
//
// Its card lists the three interfaces with FIRST_BINDING first. Prints {"ready": true} once
// both servers listen. What it does depends on the message text:
//   "ask"  -> INPUT_REQUIRED "What is your name?"; the answer completes it ("hello <name>")
//   "auth" -> AUTH_REQUIRED "Who are you?"; the answer completes it the same way
//   "fail" -> FAILED
//   else   -> echoes the text as an artifact, COMPLETED
// Like every agent on this SDK, each turn starts with a `task` event: on the turn after an
// answer, that task still says INPUT_REQUIRED (or AUTH_REQUIRED).
import express from 'express';
import * as grpc from '@grpc/grpc-js';
import { AgentCard, Task, TaskStatusUpdateEvent, TaskArtifactUpdateEvent } from '@a2a-js/sdk';
import {
  AgentEvent,
  DefaultPushNotificationSender,
  DefaultRequestHandler,
  InMemoryPushNotificationStore,
  InMemoryTaskStore,
} from '@a2a-js/sdk/server';
import {
  UserBuilder,
  agentCardHandler,
  jsonRpcHandler,
  restHandler,
} from '@a2a-js/sdk/server/express';
import { A2AService, grpcService } from '@a2a-js/sdk/server/grpc';

const [httpPort, grpcPort, first] = process.argv.slice(2);
const urls = {
  JSONRPC: `http://127.0.0.1:${httpPort}/a2a/jsonrpc`,
  'HTTP+JSON': `http://127.0.0.1:${httpPort}/a2a/rest`,
  GRPC: `127.0.0.1:${grpcPort}`,
};
const order = [first, ...Object.keys(urls).filter((b) => b !== first)];

const card = AgentCard.fromJSON({
  name: 'js-agent',
  description: 'An agent built with the official A2A JavaScript SDK',
  version: '1.0.0',
  supportedInterfaces: order.map((b) => ({ url: urls[b], protocolBinding: b, protocolVersion: '1.0' })),
  capabilities: { streaming: true, pushNotifications: true },
  defaultInputModes: ['text/plain'],
  defaultOutputModes: ['text/plain'],
  skills: [{ id: 'echo', name: 'Echo', description: 'Echoes', tags: ['echo'] }],
});

const textOf = (message) =>
  (message?.parts ?? [])
    .filter((p) => p.content?.$case === 'text')
    .map((p) => p.content.value)
    .join(' ');

function status(taskId, contextId, state, text) {
  return AgentEvent.statusUpdate(
    TaskStatusUpdateEvent.fromJSON({
      taskId,
      contextId,
      status: {
        state,
        timestamp: new Date().toISOString(),
        ...(text
          ? { message: { messageId: `agent-${process.hrtime.bigint()}`, role: 'ROLE_AGENT', parts: [{ text }], taskId, contextId } }
          : {}),
      },
    }),
  );
}

function artifact(taskId, contextId, text) {
  return AgentEvent.artifactUpdate(
    TaskArtifactUpdateEvent.fromJSON({
      taskId,
      contextId,
      artifact: { artifactId: `a-${process.hrtime.bigint()}`, name: 'answer', parts: [{ text }] },
      lastChunk: true,
    }),
  );
}

const executor = {
  async execute(context, bus) {
    const { taskId, contextId, userMessage } = context;
    const text = textOf(userMessage).trim();
    const existing = context.task;
    const task = existing
      ? { ...existing, history: [...(existing.history ?? []), userMessage] }
      : Task.fromJSON({ id: taskId, contextId, status: { state: 'TASK_STATE_SUBMITTED', timestamp: new Date().toISOString() } });
    if (!existing) task.history = [userMessage];
    bus.publish(AgentEvent.task(task)); // the task as it is, first, on every turn
    const waiting = existing?.status?.state;
    if (waiting === 6 || waiting === 8 || waiting === 'TASK_STATE_INPUT_REQUIRED' || waiting === 'TASK_STATE_AUTH_REQUIRED') {
      bus.publish(status(taskId, contextId, 'TASK_STATE_WORKING', 'thinking'));
      bus.publish(artifact(taskId, contextId, `hello ${text}`));
      bus.publish(status(taskId, contextId, 'TASK_STATE_COMPLETED', ''));
    } else if (text === 'ask') {
      bus.publish(status(taskId, contextId, 'TASK_STATE_INPUT_REQUIRED', 'What is your name?'));
    } else if (text === 'auth') {
      bus.publish(status(taskId, contextId, 'TASK_STATE_AUTH_REQUIRED', 'Who are you?'));
    } else if (text === 'fail') {
      bus.publish(status(taskId, contextId, 'TASK_STATE_FAILED', 'it broke'));
    } else {
      bus.publish(status(taskId, contextId, 'TASK_STATE_WORKING', ''));
      bus.publish(artifact(taskId, contextId, text));
      bus.publish(status(taskId, contextId, 'TASK_STATE_COMPLETED', ''));
    }
    bus.finished();
  },
  async cancelTask(taskId, bus) {
    bus.publish(status(taskId, '', 'TASK_STATE_CANCELED', 'cancelled'));
    bus.finished();
  },
};

const pushStore = new InMemoryPushNotificationStore();
const handler = new DefaultRequestHandler(
  card,
  new InMemoryTaskStore(),
  executor,
  undefined,
  pushStore,
  new DefaultPushNotificationSender(pushStore, { timeout: 2000 }),
);

const app = express();
app.use('/.well-known/agent-card.json', agentCardHandler({ agentCardProvider: async () => card }));
app.use('/a2a/jsonrpc', jsonRpcHandler({ requestHandler: handler, userBuilder: UserBuilder.noAuthentication }));
app.use('/a2a/rest', restHandler({ requestHandler: handler, userBuilder: UserBuilder.noAuthentication }));

const grpcServer = new grpc.Server();
grpcServer.addService(A2AService, grpcService({ requestHandler: handler, userBuilder: UserBuilder.noAuthentication }));

const httpServer = app.listen(Number(httpPort), '127.0.0.1', () => {
  grpcServer.bindAsync(`127.0.0.1:${grpcPort}`, grpc.ServerCredentials.createInsecure(), (error) => {
    if (error) {
      process.stdout.write(JSON.stringify({ error: String(error) }) + '\n');
      process.exit(1);
    }
    process.stdout.write(JSON.stringify({ ready: true }) + '\n');
  });
});

function stop() {
  grpcServer.forceShutdown();
  httpServer.close(() => process.exit(0));
  setTimeout(() => process.exit(0), 1000).unref();
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
process.stdin.on('end', stop); // the test closes our stdin to stop us
process.stdin.resume();
