// The CommonJS build lives in dist/cjs; this package is "type": "module", so
// dist/cjs gets its own package.json saying its .js files are CommonJS.
import { writeFileSync } from 'node:fs';

writeFileSync(new URL('../dist/cjs/package.json', import.meta.url), '{ "type": "commonjs" }\n');
