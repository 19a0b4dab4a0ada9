// Preact + htm, bound once: `html` tagged templates build the views (no build step).
import { h, render } from '../vendor/preact.module.js';
import htm from '../vendor/htm.module.js';

export const html = htm.bind(h);
export { render };
export { useState, useEffect, useLayoutEffect, useRef, useMemo, useCallback, useReducer } from '../vendor/hooks.module.js';
